from .compile_report import ClusterInfo, CompileReport
from .metrics import cosine, max_abs, sqnr_db

__all__ = ["ClusterInfo", "CompileReport", "cosine", "max_abs", "sqnr_db"]
