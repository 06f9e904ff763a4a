"""Cache of compiled clusters: in memory (sessions) and on disk (emitted ONNX models).

Key: sha256 over the cluster's FX graph text (structure, targets, literal arguments), every
constant's dtype/shape/content digest, every runtime input's dtype/shape, the backend options,
the qlower / onnxruntime / onnx versions, a digest of qlower's sources, and the CPU (model,
feature flags). A changed weight changes its digest, so it can
never hit a stale entry. Disk location: $QLOWER_CACHE_DIR, else ~/.cache/qlower/onnxruntime;
QLOWER_CACHE_DIR=off disables the disk cache.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import torch
from torch.fx import GraphModule

CACHE_ENV = "QLOWER_CACHE_DIR"


def cache_dir() -> Path | None:
    value = os.environ.get(CACHE_ENV)
    if value == "off":
        return None
    return Path(value) if value else Path.home() / ".cache" / "qlower" / "onnxruntime"


def cluster_key(sub: GraphModule, constants: dict[str, torch.Tensor], options) -> str:
    import onnx
    import onnxruntime

    from ... import __version__
    from .cpu import fingerprint
    h = hashlib.sha256()
    h.update(_canonical_text(sub).encode())
    for node in sub.graph.nodes:
        if node.op == "placeholder":
            if node.name in constants:
                t = constants[node.name].detach().contiguous()
                h.update(f"const:{t.dtype}:{tuple(t.shape)}:".encode())
                h.update(hashlib.sha256(t.view(torch.uint8).numpy().tobytes()
                                        if t.numel() else b"").digest())
            else:
                v = node.meta.get("val")
                h.update(f"input:{getattr(v, 'dtype', None)}:{tuple(getattr(v, 'shape', ()))}".encode())
    h.update(f"{options}|{__version__}|{onnxruntime.__version__}|{onnx.__version__}|{fingerprint()}".encode())
    h.update(_emitter_digest().encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _emitter_digest() -> str:
    """Digest of qlower's own sources: an edited emitter (an editable install between releases)
    must not be served models emitted by the old one."""
    root = Path(__file__).resolve().parents[2]
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


def load_model(key: str) -> bytes | None:
    d = cache_dir()
    path = d / f"{key}.onnx" if d else None
    return path.read_bytes() if path is not None and path.exists() else None


def store_model(key: str, model_bytes: bytes) -> None:
    d = cache_dir()
    if d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"{key}.onnx.tmp{os.getpid()}"
        tmp.write_bytes(model_bytes)
        tmp.replace(d / f"{key}.onnx")  # atomic: concurrent compiles never see half a file
    except OSError:
        pass  # a read-only or full disk only costs recompilation
