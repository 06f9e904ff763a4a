"""`qlower.export(cm, path, format="onnx")` for a model compiled with backend="onnxruntime".

Only a model that is ONE onnxruntime cluster can be exported as one ONNX file: anything else
would need qlower's PyTorch glue to run. The file is exactly the model the backend's session
runs (the NaN-check sums added to the session are not in it)."""
from __future__ import annotations

from pathlib import Path

from ...errors import BackendError
from ..base import whole_model_cluster_info
from ...artifact import atomic_write


def export_onnx(cm, path: Path) -> Path:
    """Write the whole-model cluster's ONNX to `path` (atomically), or a BackendError naming
    what prevents it."""
    info = whole_model_cluster_info(cm, "onnxruntime", "ONNX graph")
    if info.onnx is None:
        raise BackendError("the model's cluster kept no ONNX model (it computes constants only)",
                           hint="export it as .pt2")
    atomic_write(path, lambda tmp: tmp.write_bytes(info.onnx))   # typed error, never half a file
    return path
