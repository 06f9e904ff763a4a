"""Graph passes, one per file. `default_pipeline()` is the order qlower runs them in."""
from .attach_qparams import AttachQParams
from .base import Pass, PassContext
from .canonicalize_qdq import CanonicalizeQDQ
from .fold_float_constants import FoldFloatConstants
from .fold_quantized_constants import FoldQuantizedConstants
from .lower_qdq import LowerQDQ
from .manager import PassManager, verify
from .propagate_dequantize import PropagateDequantize


def default_pipeline() -> list[Pass]:
    return [FoldFloatConstants(), AttachQParams(), FoldQuantizedConstants(), PropagateDequantize(), LowerQDQ(), CanonicalizeQDQ()]


__all__ = ["Pass", "PassContext", "PassManager", "verify", "default_pipeline",
           "AttachQParams", "FoldFloatConstants", "FoldQuantizedConstants", "PropagateDequantize", "LowerQDQ", "CanonicalizeQDQ"]
