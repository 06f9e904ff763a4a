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


def _float_conv(node: Node) -> str | None:
    """numeric padding"""
    pad = node.args[4] if len(node.args) > 4 else 0
    return "string padding is not emitted" if isinstance(pad, str) else _float_only(node)


def _eval_batch_norm(node: Node) -> str | None:
    """inference mode with running statistics"""
    if node.args[5]:
        return "batch_norm in training mode"
    if node.args[3] is None or node.args[4] is None:
        return "batch_norm without running statistics"
    return _float_only(node)


def _constant_bounds(node: Node) -> str | None:
    """constant bounds"""
    if any(isinstance(b, Node) for b in node.args[1:]):
        return "clamp with tensor bounds is not emitted"
    return _float_only(node)


def _no_divisor_override(node: Node) -> str | None:
    """no divisor_override"""
    if len(node.args) > 6 and node.args[6] is not None:
        return "avg_pool2d with divisor_override is not emitted"
    return _float_only(node)


def _adaptive_pool(node: Node) -> str | None:
    """output size 1x1 only"""
    return None if list(node.args[1]) in ([1, 1], [1]) else "only global pooling is emitted"


def _getitem_of_supported(node: Node) -> str | None:
    """item of a multi-output op that is emitted (unbind, split, lstm, gru)"""
    src = node.args[0]
    multi = (torch.ops.aten.unbind.int, torch.ops.aten.split.Tensor, torch.ops.qlower.lstm.default,
             torch.ops.qlower.gru.default, torch.ops.aten.lstm.input, torch.ops.aten.gru.input)
    return None if getattr(src, "target", None) in multi else "getitem of an op not emitted"


def _integer_arange(node: Node) -> str | None:
    """constant end, default start/step"""
    return None if len(node.args) == 1 and isinstance(node.args[0], int) else "non-constant arange"


def _attention(node: Node) -> str | None:
    """no dropout"""
    from .blockops import attention_args
    return None if not attention_args(node)[6] else "dropout in attention"


def _rotary(node: Node) -> str | None:
    """static head dimension"""
    return None if isinstance(node.args[0].meta["val"].shape[-1], int) else "symbolic head dimension"


def _rnn(node: Node) -> str | None:
    """batched 3-D input, unidirectional, inference, constant weights with biases"""
    from .blockops import rnn_args
    parsed = rnn_args(node)
    if parsed is None:
        return "bidirectional, training-mode or bias-free recurrent layers are not emitted"
    x, weights, layers = parsed[1], parsed[4], parsed[5]
    if x.meta["val"].dim() != 3:
        return "unbatched input"
    if len(weights) != 4 * layers or any(getattr(w, "op", None) != "get_attr" for w in weights):
        return "recurrent weights must be constant tensors with biases"
    return None


def _leading_index(node: Node) -> str | None:
    """index tensors (no None) on the leading dims, static index shapes"""
    indices = node.args[1]
    if any(i is None for i in indices):
        return "indexing with None (a sliced dimension before an indexed one) is not emitted"
    if any(not isinstance(d, int) for i in indices for d in i.meta["val"].shape):
        return "advanced indexing with symbolic index shapes is not emitted"
    return _float_only(node)


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
                  "aten::sigmoid", "aten::tanh", "aten::linear", "aten::cat", "aten::slice.Tensor",
                  "aten::alias"], _float_only)
    cap.register(["aten::conv1d", "aten::conv2d"], _float_conv)
    cap.register("aten::batch_norm", _eval_batch_norm)
    cap.register(["aten::hardtanh", "aten::hardswish", "aten::hardsigmoid", "aten::max_pool2d"], _float_only)
    cap.register("aten::clamp", _constant_bounds)
    cap.register("aten::avg_pool2d", _no_divisor_override)
    cap.register("aten::adaptive_avg_pool2d", _adaptive_pool)
    cap.register(["qlower::layer_norm", "qlower::skip_layer_norm", "qlower::rms_norm", "qlower::group_norm",
                  "qlower::masked_softmax", "qlower::kv_cache_update", "qlower::stream_buffer"])
    cap.register(["qlower::attention", "aten::scaled_dot_product_attention"], _attention)
    cap.register("qlower::rotary_embedding", _rotary)
    cap.register(["qlower::lstm", "qlower::gru", "aten::lstm.input", "aten::gru.input"], _rnn)
    cap.register("aten::index.Tensor", _leading_index)
    cap.register(["aten::matmul", "aten::bmm", "aten::mm", "aten::addmm"], _float_only)
    cap.register(["aten::ge.Scalar", "aten::gt.Scalar", "aten::le.Scalar", "aten::lt.Scalar", "aten::eq.Scalar",
                  "aten::ge.Tensor", "aten::gt.Tensor", "aten::le.Tensor", "aten::lt.Tensor", "aten::eq.Tensor",
                  "aten::__and__.Tensor", "aten::logical_and", "aten::bitwise_and.Tensor", "aten::__or__.Tensor",
                  "aten::logical_or", "aten::bitwise_or.Tensor", "aten::neg", "aten::sqrt", "aten::exp", "aten::cos",
                  "aten::sin", "aten::logical_not", "aten::bitwise_not", "aten::reciprocal", "aten::erf",
                  "aten::rsqrt", "aten::silu", "aten::pow.Tensor_Scalar", "aten::where.self",
                  "aten::masked_fill.Scalar", "aten::index_select", "aten::index_copy", "aten::copy", "aten::gather",
                  "aten::zeros_like", "aten::ones_like", "aten::full_like", "aten::where.Scalar",
                  "aten::where.ScalarOther", "aten::where.ScalarSelf", "aten::to.dtype_layout", "aten::split.Tensor"], _float_only)
    cap.register("getitem", _getitem_of_supported)
    cap.register("aten::arange", _integer_arange)
    cap.register(["aten::unsqueeze", "aten::squeeze.dim", "aten::squeeze.dims", "aten::select.int",
                  "aten::embedding", "aten::mean.dim", "aten::stack", "aten::rsub.Scalar", "aten::to.dtype",
                  "aten::dropout", "aten::to.device", "aten::clone", "aten::lift_fresh_copy", "aten::new_ones",
                  "aten::new_zeros", "aten::ones", "aten::zeros", "aten::full"], _float_only)
    return cap
