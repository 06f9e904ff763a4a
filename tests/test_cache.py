"""The onnxruntime cluster cache: disk entries are verified before use and a bad one is rebuilt
(never trusted, never sticky); in-memory caches are bounded LRUs."""
import threading

import pytest
import torch

import qlower
import qlower.backends.onnxruntime as ortb
from qlower.core import cache
from qlower.errors import QlowerError

KEY_A, KEY_B = "a" * 64, "b" * 64


def test_entry_roundtrip_and_bad_entries_are_discarded(tmp_path):
    cache.store_entry(KEY_A, b"model A bytes")
    cache.store_entry(KEY_B, b"model B bytes")
    assert cache.load_entry(KEY_A) == (b"model A bytes", "hit")
    path_a, path_b = cache._entry_path(KEY_A), cache._entry_path(KEY_B)
    for damage in (lambda d: d[:-3],                       # truncated
                   lambda d: d[:-1] + bytes([d[-1] ^ 1]),   # flipped bit
                   lambda d: path_b.read_bytes(),           # another key's valid model
                   None):                                   # no digest (an older qlower's entry)
        cache.store_entry(KEY_A, b"model A bytes")
        if damage is None:
            path_a.with_name(path_a.name + ".sha256").unlink()
        else:
            path_a.write_bytes(damage(path_a.read_bytes()))
        assert cache.load_entry(KEY_A) == (None, "corrupt")
        assert not path_a.exists()                          # discarded ...
        assert cache.load_entry(KEY_A) == (None, "absent")  # ... so the next compile rebuilds it
    assert cache.load_model(KEY_B) == b"model B bytes"


def test_disk_cache_off(monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    cache.store_entry(KEY_A, b"x")
    assert cache.load_entry(KEY_A) == (None, "absent")


def _fresh_memory(monkeypatch):
    monkeypatch.setattr(ortb, "_SESSIONS", {})
    monkeypatch.setattr(ortb, "_MODELS", {})


def _mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()


def test_corrupt_or_swapped_entry_is_rebuilt_not_trusted(monkeypatch):
    """Was: a truncated entry made every later compile fall back; a swapped .onnx was served."""
    model, x = _mlp(0), (torch.randn(2, 8),)
    first = qlower.compile(model, x, backend="onnxruntime")
    entries = sorted(cache.cache_dir().glob("*.onnx"))
    assert entries and first.report().compiled[0].cache == "miss"
    qlower.compile(_mlp(1), x, backend="onnxruntime")   # a valid entry of another model
    foreign = next(p for p in cache.cache_dir().glob("*.onnx") if p not in entries)
    for damage in (lambda p: p.write_bytes(p.read_bytes()[:100]), lambda p: p.write_bytes(foreign.read_bytes())):
        for p in entries:
            damage(p)
        _fresh_memory(monkeypatch)
        again = qlower.compile(model, x, backend="onnxruntime")
        assert not again.report().fallbacks
        assert all(c.cache != "disk" for c in again.report().compiled)
        assert torch.allclose(again(*x), model(*x), atol=1e-6)
        assert all(cache.load_entry(p.stem)[1] == "hit" for p in entries)   # rebuilt, valid
    _fresh_memory(monkeypatch)
    assert qlower.compile(model, x, backend="onnxruntime").report().compiled[0].cache == "disk"


def test_lru_keeps_the_most_recently_used():
    lru = cache.LRUCache(maxsize=2)
    lru["a"], lru["b"] = 1, 2
    assert lru["a"] == 1          # a is now the most recently used
    lru["c"] = 3
    assert list(lru) == ["a", "c"] and "b" not in lru and len(lru) == 2
    lru["a"] = 10
    lru["d"] = 4
    assert dict(lru) == {"a": 10, "d": 4}


def test_lru_size_comes_from_the_settings_at_first_use(monkeypatch):
    monkeypatch.setenv(cache.MEMORY_ENV, "3")
    lru = cache.LRUCache()
    for i in range(10):
        lru[i] = i
    assert list(lru) == [7, 8, 9]
    monkeypatch.setenv(cache.MEMORY_ENV, "5")   # an existing cache keeps its size ...
    lru[10] = 10
    assert list(lru) == [8, 9, 10]
    fresh = cache.LRUCache()                    # ... a new one reads the settings again
    for i in range(10):
        fresh[i] = i
    assert list(fresh) == [5, 6, 7, 8, 9]
    monkeypatch.setenv(cache.MEMORY_ENV, "zero")
    with pytest.raises(QlowerError, match=cache.MEMORY_ENV) as info:
        cache.LRUCache()[1] = 1
    assert info.value.hint


def test_lru_is_safe_under_threads():
    lru = cache.LRUCache(maxsize=8)

    def work(offset):
        for i in range(2000):
            lru[(offset, i % 16)] = i
            lru.get((offset, (i * 7) % 16))
    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(lru) == 8 and len(list(lru)) == 8


@pytest.mark.parametrize("which", [".onnx", ".onnx.sha256"])
def test_entry_or_digest_that_is_a_directory_is_removed_and_rebuilt(monkeypatch, which):
    """Was: every later compile of the model fell back to PyTorch (`Is a directory`)."""
    model, x = _mlp(0), (torch.randn(2, 8),)
    qlower.compile(model, x, backend="onnxruntime")
    (entry,) = cache.cache_dir().glob("*.onnx")
    damaged = entry.with_name(entry.stem + which)
    damaged.unlink()
    (damaged / "inner").mkdir(parents=True)
    _fresh_memory(monkeypatch)
    again = qlower.compile(model, x, backend="onnxruntime")
    assert not again.report().fallbacks
    assert torch.allclose(again(*x), model(*x), atol=1e-6)
    assert damaged.is_file() and cache.load_entry(entry.stem)[1] == "hit"   # rebuilt, valid


def test_world_writable_cache_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(cache.CACHE_ENV, str(shared))
    monkeypatch.setattr(cache.os, "getuid", lambda: shared.stat().st_uid + 1)   # owned by someone else
    with pytest.raises(QlowerError, match="writable by everyone"):
        cache.load_entry(KEY_A)
    with pytest.raises(QlowerError, match="writable by everyone"):
        qlower.compile(_mlp(0), (torch.randn(2, 8),), backend="onnxruntime")
    shared.chmod(0o700)   # not world-writable: used
    cache.store_entry(KEY_A, b"x")
    assert cache.load_entry(KEY_A) == (b"x", "hit")
