from .compile_report import ClusterInfo, CompileReport
from .metrics import cosine, max_abs, sqnr_db
from .sensitivity import LayerSensitivity, sensitivity

__all__ = ["ClusterInfo", "CompileReport", "cosine", "max_abs", "sqnr_db", "LayerSensitivity", "sensitivity"]
