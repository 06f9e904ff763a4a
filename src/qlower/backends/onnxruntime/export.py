"""`qlower.export(cm, path, format="onnx")` for a model compiled with backend="onnxruntime".

Only a model that is ONE onnxruntime cluster can be exported as one ONNX file: anything else
would need qlower's PyTorch glue to run. The file is exactly the model the backend's session
runs (the NaN-check sums added to the session are not in it)."""
from __future__ import annotations

from pathlib import Path

from ...errors import BackendError


def export_onnx(cm, path: Path) -> Path:
    """Write the whole-model cluster's ONNX to `path` (atomically), or a BackendError naming
    what prevents it."""
    report = cm.report()
    if report.backend != "onnxruntime":
        raise BackendError(f"ONNX export needs a model compiled for onnxruntime, not {report.backend!r}",
                           hint="compile with backend='onnxruntime'")
    blockers = [f"{next(iter(c.ops))}: {c.reason}" for c in report.clusters if c.status != "compiled"]
    compiled = [c for c in report.clusters if c.status == "compiled"]
    if blockers or len(compiled) != 1 or compiled[0].onnx is None or cm._executable.run is cm._executable.module:
        detail = "; ".join(blockers) or f"{len(compiled)} clusters with PyTorch code between them"
        raise BackendError(f"the model is not one ONNX graph: {detail}",
                           hint="`qlower schema` lists every node and why it is not supported")
    from ...runtime.artifact import atomic_write
    atomic_write(path, lambda tmp: tmp.write_bytes(compiled[0].onnx))   # typed error, never half a file
    return path
