"""Cache of compiled clusters: in memory (sessions) and on disk (emitted ONNX models).

Key: sha256 over the cluster's FX graph text (structure, targets, literal arguments), every
constant's dtype/shape/content digest, every runtime input's dtype/shape, the backend options,
the qlower / onnxruntime / onnx versions, a digest of qlower's sources, and the CPU (model,
feature flags). A changed weight changes its digest, so it can
never hit a stale entry. Disk location: $QLOWER_CACHE_DIR, else ~/.cache/qlower/onnxruntime;
QLOWER_CACHE_DIR=off disables the disk cache.

Disk entries are verified before use: `<key>.onnx` (the model, a plain ONNX file) comes with
`<key>.onnx.sha256`, the sha256 of key + model. A truncated, corrupt or swapped entry (another
key's model, an entry without digest from an older qlower) fails the check, is deleted and
rebuilt: never trusted, never sticky (an entry that is a directory too). This
detects accidents and mix-ups; it does not authenticate (anyone who can write the directory can
also compute the digest), so the directory is created private (0700) — see docs/trust.md.

In-memory caches are bounded: `LRUCache` keeps the most recently used entries, at most
$QLOWER_MEMORY_CACHE_ENTRIES (default 64, read once per process).
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import stat
import threading
import uuid
from collections import OrderedDict
from collections.abc import MutableMapping
from pathlib import Path

import torch
from torch.fx import GraphModule

from ..errors import QlowerError
from . import cpu
from .settings import settings
from .version import __version__

CACHE_ENV = "QLOWER_CACHE_DIR"
MEMORY_ENV = "QLOWER_MEMORY_CACHE_ENTRIES"
_DIGEST_SUFFIX = ".sha256"


def cache_dir() -> Path | None:
    """The disk cache's directory ($QLOWER_CACHE_DIR), None when it is off. An existing one that
    others can write (world-writable and owned by another user) is refused: its entries (a vmfb
    is code) could be anyone's."""
    d = settings().cache_dir
    if d is not None:
        _check_safe(d)
    return d


def _check_safe(d: Path) -> None:
    try:
        st = d.stat()
    except OSError:
        return   # absent: created private (0700) at the first store
    if st.st_uid != os.getuid() and st.st_mode & stat.S_IWOTH:
        raise QlowerError(f"the cache directory {d} is writable by everyone and owned by another user "
                          f"(uid {st.st_uid}): its entries cannot be trusted",
                          hint=f"set {CACHE_ENV} to a directory of your own, or {CACHE_ENV}=off")


def _remove(path: Path) -> None:
    """Delete an entry of any file type (a directory where a file belongs, too): damage is
    never sticky."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def cluster_key(sub: GraphModule, constants: dict[str, torch.Tensor], options) -> str:
    import onnx
    import onnxruntime

    h = hashlib.sha256()
    h.update(_canonical_text(sub).encode())
    for node in sub.graph.nodes:
        if node.op == "placeholder":
            if node.name in constants:
                t = constants[node.name].detach().contiguous()
                h.update(f"const:{t.dtype}:{tuple(t.shape)}:".encode())
                h.update(hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy().tobytes()
                                        if t.numel() else b"").digest())   # reshape: view() refuses 0-d
            else:
                v = node.meta.get("val")
                h.update(f"input:{getattr(v, 'dtype', None)}:{tuple(getattr(v, 'shape', ()))}".encode())
    h.update(f"{options}|{__version__}|{onnxruntime.__version__}|{onnx.__version__}|{cpu.fingerprint()}".encode())
    h.update(_emitter_digest().encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _emitter_digest() -> str:
    """Digest of qlower's own sources: an edited emitter (an editable install between releases)
    must not be served models emitted by the old one."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()


def _canonical_text(sub: GraphModule) -> str:
    """The graph with node names replaced by positions: equal structure gives equal text even
    though generated constant names differ between compilations."""
    index = {n: i for i, n in enumerate(sub.graph.nodes)}

    def arg(a):
        from torch.fx import Node
        if isinstance(a, Node):
            return f"%{index[a]}"
        if isinstance(a, (list, tuple)):
            return "[" + ",".join(arg(x) for x in a) + "]"
        return repr(a)
    return "\n".join(f"{n.op}|{n.target if n.op != 'placeholder' else ''}|{arg(n.args)}|"
                     f"{sorted((k, arg(v)) for k, v in n.kwargs.items())}" for n in sub.graph.nodes)


def _entry_path(key: str, suffix: str = ".onnx") -> Path | None:
    d = cache_dir()
    return d / f"{key}{suffix}" if d else None


def _digest(key: str, model_bytes: bytes) -> str:
    """Binds the model to its key: a valid model copied under another key's name fails."""
    return hashlib.sha256(key.encode() + b"\0" + model_bytes).hexdigest()


def load_entry(key: str, suffix: str = ".onnx") -> tuple[bytes | None, str]:
    """(model bytes or None, status): "hit" (verified), "absent" (no entry or no disk cache), or
    "corrupt" (the entry failed verification and was deleted; the caller rebuilds it). `suffix`
    names the kind of entry (".onnx" models; backend="auto" stores its decisions too)."""
    path = _entry_path(key, suffix)
    if path is None or not path.exists():
        return None, "absent"
    digest_path = path.with_name(path.name + _DIGEST_SUFFIX)
    try:
        want, model = digest_path.read_text().strip(), path.read_bytes()
    except (OSError, UnicodeDecodeError):
        want, model = None, b""
    if want == _digest(key, model):
        return model, "hit"
    try:
        _remove(path)
        _remove(digest_path)
    except OSError:
        pass   # not removable (a read-only directory): rebuilt each time, never trusted
    return None, "corrupt"


def load_model(key: str) -> bytes | None:
    """The verified model stored for `key`, or None (absent, or corrupt and now deleted)."""
    return load_entry(key)[0]


def store_entry(key: str, model_bytes: bytes, suffix: str = ".onnx") -> None:
    """Store an entry (`suffix` names its kind, as for `load_entry`). Data first, digest last
    (each written to a temporary file and renamed): a reader that comes in between, or a crash,
    leaves a mismatch, which only costs a rebuild."""
    d = cache_dir()
    if d is None:
        return
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        _replace(d / f"{key}{suffix}", model_bytes)
        _replace(d / f"{key}{suffix}{_DIGEST_SUFFIX}", _digest(key, model_bytes).encode())
    except OSError:
        pass  # a read-only or full disk only costs recompilation


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    if path.is_dir() and not path.is_symlink():   # an entry of the wrong file type
        _remove(path)
    try:
        tmp.write_bytes(data)
        tmp.replace(path)  # atomic: concurrent compiles never see half a file
    finally:
        tmp.unlink(missing_ok=True)


class LRUCache(MutableMapping):
    """A dict that keeps only the `maxsize` most recently used entries (thread-safe).

    For in-memory caches of sessions / emitted models: without a bound, every model compiled in a
    long-running process stays in memory after it is deleted. Evicting an entry only drops the
    cache's reference (a compiled model holding a session keeps it alive). `maxsize` None: read
    $QLOWER_MEMORY_CACHE_ENTRIES (once per process) at the first insertion. `in` does not count
    as a use; reading an item does."""

    def __init__(self, maxsize: int | None = None):
        self._maxsize = maxsize
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    @property
    def maxsize(self) -> int:
        if self._maxsize is None:
            self._maxsize = settings().memory_cache_entries
        return self._maxsize

    def __getitem__(self, key):
        with self._lock:
            value = self._data[key]
            self._data.move_to_end(key)
            return value

    def __setitem__(self, key, value) -> None:
        limit = self.maxsize
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > limit:
                self._data.popitem(last=False)

    def __delitem__(self, key) -> None:
        with self._lock:
            del self._data[key]

    def __contains__(self, key) -> bool:
        with self._lock:
            return key in self._data

    def __iter__(self):
        with self._lock:
            return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
