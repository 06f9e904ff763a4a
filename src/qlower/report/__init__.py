from ..core.types import ClusterInfo, CompileReport
from ..core.metrics import cosine, max_abs, sqnr_db
from .sensitivity import LayerSensitivity, sensitivity
from .verify import ActivationStats, LayerReport, Metrics, Suggestion, VerifyReport, WeightStats, verify

__all__ = ["ClusterInfo", "CompileReport", "cosine", "max_abs", "sqnr_db", "LayerSensitivity", "sensitivity",
           "verify", "VerifyReport", "LayerReport", "ActivationStats", "WeightStats", "Suggestion", "Metrics"]
