"""A cluster as portable ONNX: standard `ai.onnx` operators only.

The translation of `translate.translate_cluster` with ONNX Runtime's contrib kernels turned off
(`standard_onnx_only`: QLinearAdd, QLinearGlobalAveragePool and the fused QGemm /
MatMulIntegerToFloat forms take their standard-op formulations) and qlower's block-op functions
inlined, so the model imports nothing but the default domain. The integer ops stay integer
(ConvInteger, MatMulInteger, QuantizeLinear / DequantizeLinear, Gather tables), so a consumer
that computes those ops as ONNX defines them computes qlower's canonical numerics; how far each
consumer departs from that is measured at export (`qlower.onnx.export_checks`)."""
from __future__ import annotations

import onnx

from .lowering.onnx_ops import standard_onnx_only
from .translate import translate_cluster

STANDARD_DOMAINS = frozenset({"", "ai.onnx"})


def translate_standard(sub, constants) -> onnx.ModelProto:
    """The cluster's ONNX model in standard operators only (functions inlined)."""
    import onnx.inliner
    with standard_onnx_only():
        model = translate_cluster(sub, constants)
    model = onnx.inliner.inline_local_functions(model)
    del model.functions[:]
    kept = [o for o in model.opset_import if o.domain in STANDARD_DOMAINS]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return model


def non_standard_domains(model: onnx.ModelProto) -> set[str]:
    """The operator domains of `model`'s nodes (functions included) other than ai.onnx."""
    nodes = list(model.graph.node) + [n for f in model.functions for n in f.node]
    return {n.domain for n in nodes if n.domain not in STANDARD_DOMAINS}
