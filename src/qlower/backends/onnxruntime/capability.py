"""What the onnxruntime backend accepts (schema name -> predicate)."""
from __future__ import annotations

import torch
from torch.fx import Node

from ...partition import Capability
from .cpu import has_vnni


def _float_only(node: Node) -> str | None:
    """float32 or integer tensors"""
    for a in [node, *node.all_input_nodes]:
        v = a.meta.get("val")
        if isinstance(v, torch.Tensor) and v.dtype not in (torch.float32, torch.uint8, torch.int8, torch.int32,
                                                           torch.int64, torch.bool):
            return f"dtype {v.dtype} not emitted"
    return None


def _static_shape_args(node: Node) -> str | None:
    """target shape must be static"""
    shape = node.args[1]
    if any(not isinstance(d, int) for d in shape):
        return "reshape to a symbolic shape is not emitted"
    return _float_only(node)


def _requant_float(node: Node) -> str | None:
    """'float' numerics profile only"""
    return None if node.args[8] == "float" else "onnxruntime reproduces only the 'float' requantization profile"


def _matmul_operands(node: Node) -> str | None:
    """u8 x u8 (exact on AVX2) or VNNI"""
    a, b = node.args[0].meta["val"].dtype, node.args[2].meta["val"].dtype
    if a != torch.uint8:
        return "MatMulInteger is emitted for uint8 first operands only"
    if b == torch.int8 and not has_vnni():
        return "u8 x full-range s8 activations saturate on AVX2 without VNNI"
    return None


def _quantize_per_tensor_range(node: Node) -> str | None:
    """natural dtype range"""
    from ... import numerics
    return None if (node.args[3], node.args[4]) == numerics.dtype_range(node.args[5]) else "narrowed range"


def _adaptive_pool(node: Node) -> str | None:
    """output size 1x1 only"""
    return None if list(node.args[1]) in ([1, 1], [1]) else "only global pooling is emitted"


def _getitem_of_supported(node: Node) -> str | None:
    """item of an unbind (the only multi-output op emitted)"""
    src = node.args[0]
    return None if getattr(src, "target", None) in (torch.ops.aten.unbind.int, torch.ops.aten.split.Tensor) \
        else "getitem of an op not emitted"


def _integer_arange(node: Node) -> str | None:
    """constant end, default start/step"""
    return None if len(node.args) == 1 and isinstance(node.args[0], int) else "non-constant arange"


def _masked_softmax(node: Node) -> str | None:
    """additive-mask mode (lengths mode runs in PyTorch)"""
    return None if node.args[2] is None else "sequence-lengths mode has no ONNX lowering yet"


def _attention(node: Node) -> str | None:
    """static shapes, additive (float) mask"""
    vals = [a.meta["val"] for a in node.args[:3]]
    if any(not isinstance(d, int) for v in vals for d in v.shape):
        return "attention with symbolic shapes is not emitted"
    mask = node.args[3]
    if mask is not None and mask.meta["val"].dtype == torch.bool:
        return "boolean attention masks are not emitted"
    return None


def _rotary(node: Node) -> str | None:
    """half-split rotation (interleaved runs in PyTorch)"""
    return None if not node.args[3] else "interleaved rotary has no ONNX lowering yet"


def _sdpa(node: Node) -> str | None:
    """static shapes, no dropout"""
    vals = [a.meta["val"] for a in node.args[:3]]
    if any(not isinstance(d, int) for v in vals for d in v.shape):
        return "attention with symbolic shapes is not emitted"
    dropout = node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0)
    return None if not dropout else "dropout in attention"


def _mean_small(node: Node) -> str | None:
    """reduced element count below 2^15 (keeps the fp32 quotient's rounding exact)"""
    import math
    shape = node.args[0].meta["val"].shape
    dims = node.args[2]
    if any(not isinstance(shape[d], int) for d in dims):
        return "mean over a symbolic dimension"
    return None if math.prod(shape[d] for d in dims) < 2**15 else "mean over too many elements for exact fp32 rounding"


def onnxruntime_capability() -> Capability:
    cap = Capability("onnxruntime")
    cap.register("qlower::mean", _mean_small)
    cap.register(["qlower::conv2d", "qlower::conv1d", "qlower::linear", "qlower::dequantize", "qlower::add", "qlower::mul",
                  "qlower::max_pool2d"])
    cap.register("qlower::quantize", _quantize_per_tensor_range)
    cap.register("qlower::requantize", _requant_float)
    cap.register("qlower::matmul", _matmul_operands)
    cap.register(["aten::reshape", "aten::view", "aten::expand"], _static_shape_args)
    cap.register(["aten::permute", "aten::transpose.int", "aten::flatten.using_ints", "aten::unbind.int",
                  "aten::add.Tensor", "aten::mul.Tensor", "aten::sub.Tensor", "aten::div.Tensor",
                  "aten::softmax.int", "aten::layer_norm", "aten::gelu", "aten::relu", "aten::abs",
                  "aten::sigmoid", "aten::tanh", "aten::linear", "aten::cat", "aten::slice.Tensor", "aten::max_pool2d",
                  "aten::alias"], _float_only)
    cap.register("aten::adaptive_avg_pool2d", _adaptive_pool)
    cap.register(["qlower::layer_norm", "qlower::skip_layer_norm", "qlower::rms_norm", "qlower::group_norm"])
    cap.register("qlower::masked_softmax", _masked_softmax)
    cap.register("qlower::attention", _attention)
    cap.register("qlower::rotary_embedding", _rotary)
    cap.register(["aten::matmul", "aten::bmm", "aten::mm"], _float_only)
    cap.register(["aten::ge.Scalar", "aten::gt.Scalar", "aten::le.Scalar", "aten::lt.Scalar", "aten::eq.Scalar",
                  "aten::ge.Tensor", "aten::gt.Tensor", "aten::le.Tensor", "aten::lt.Tensor", "aten::eq.Tensor",
                  "aten::__and__.Tensor", "aten::logical_and", "aten::bitwise_and.Tensor", "aten::__or__.Tensor",
                  "aten::logical_or", "aten::bitwise_or.Tensor", "aten::neg", "aten::sqrt", "aten::exp", "aten::cos",
                  "aten::sin", "aten::logical_not", "aten::bitwise_not", "aten::reciprocal", "aten::erf",
                  "aten::rsqrt", "aten::silu", "aten::pow.Tensor_Scalar", "aten::where.self",
                  "aten::masked_fill.Scalar", "aten::to.dtype_layout", "aten::split.Tensor"], _float_only)
    cap.register("aten::scaled_dot_product_attention", _sdpa)
    cap.register("getitem", _getitem_of_supported)
    cap.register("aten::arange", _integer_arange)
    cap.register(["aten::unsqueeze", "aten::squeeze.dim", "aten::squeeze.dims", "aten::select.int",
                  "aten::embedding", "aten::mean.dim", "aten::stack", "aten::rsub.Scalar", "aten::to.dtype",
                  "aten::dropout", "aten::to.device", "aten::clone", "aten::lift_fresh_copy", "aten::new_ones",
                  "aten::new_zeros", "aten::ones", "aten::zeros", "aten::full"], _float_only)
    return cap
