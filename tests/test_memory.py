"""core/memory.py: the heap pages freed by a compile go back to the OS."""
import platform

import qlower
from qlower.core import memory


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_freed_heap_pages_are_returned():
    """glibc: 64 KB blocks come from the heap (below its mmap threshold); every tenth one kept
    alive leaves holes that glibc does not trim by itself, and release_freed_memory returns
    them. Another C library or OS: nothing to call, and it says so."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        assert memory.release_freed_memory() is False
        return
    memory.release_freed_memory()
    blocks = [bytearray(64 * 1024) for _ in range(4000)]   # ~250 MB, touched (zeroed)
    kept = blocks[::10]
    del blocks
    held = _rss_mb()
    assert memory.release_freed_memory()
    assert held - _rss_mb() > 150, "the freed ~225 MB stayed resident"
    assert len(kept) == 400


def test_compile_releases_what_it_freed(monkeypatch):
    import torch
    calls = []
    monkeypatch.setattr("qlower.api.release_freed_memory", lambda: calls.append(1) or True)
    qlower.compile(torch.nn.Linear(4, 2), (torch.randn(1, 4),), backend="reference")
    assert calls == [1]
