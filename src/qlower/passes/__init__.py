"""Graph passes, one per file. `default_pipeline()` is the order qlower runs them in."""
from .attach_qparams import AttachQParams
from .base import Pass, PassContext
from .canonicalize_qdq import CanonicalizeQDQ
from .drop_eval_dropout import DropEvalDropout
from .drop_metadata_asserts import DropMetadataAsserts
from .fold_empty_tensors import FoldEmptyTensors
from .fold_float_constants import FoldFloatConstants
from .fold_quantized_constants import FoldQuantizedConstants
from .fold_scale_into_dequantize import FoldScaleIntoDequantize
from .functionalize_state import FunctionalizeState
from .inline_grad_mode_regions import InlineGradModeRegions
from .integer_layer_norm import IntegerLayerNorm
from .integer_rms_norm import IntegerRMSNorm
from .integer_softmax import IntegerSoftmax
from .lower_dynamic_linear import LowerDynamicLinear
from .lower_per_token import LowerPerTokenLinear
from .lower_qdq import LowerQDQ
from .manager import PassManager, verify
from .masked_select_bounds import MaskedSelectBounds
from .propagate_dequantize import PropagateDequantize
from .rnn_seq_first import RnnSeqFirst
from .tabulate_pointwise import TabulatePointwise


def default_pipeline() -> list[Pass]:
    return [DropEvalDropout(), InlineGradModeRegions(), DropMetadataAsserts(), MaskedSelectBounds(),
            FunctionalizeState(), RnnSeqFirst(), FoldEmptyTensors(), FoldFloatConstants(), AttachQParams(),
            FoldQuantizedConstants(),
            PropagateDequantize(), LowerPerTokenLinear(), LowerDynamicLinear(), LowerQDQ(), CanonicalizeQDQ(),
            FoldScaleIntoDequantize(), TabulatePointwise(), IntegerLayerNorm(), IntegerRMSNorm(), IntegerSoftmax()]


__all__ = ["Pass", "PassContext", "PassManager", "verify", "default_pipeline",
           "AttachQParams", "DropEvalDropout", "DropMetadataAsserts", "MaskedSelectBounds", "FoldEmptyTensors",
           "FoldFloatConstants", "FunctionalizeState", "InlineGradModeRegions", "FoldQuantizedConstants",
           "PropagateDequantize", "RnnSeqFirst", "LowerPerTokenLinear", "LowerDynamicLinear", "LowerQDQ",
           "CanonicalizeQDQ",
           "FoldScaleIntoDequantize", "TabulatePointwise", "IntegerLayerNorm", "IntegerRMSNorm", "IntegerSoftmax"]
