"""Integer ops of the lowered graph (namespace `qlower`), each with a bit-exact reference
kernel that calls `qlower.numerics` and a fake kernel for shapes (symbolic dims allowed).

Accumulating ops (conv1d/conv2d/linear/matmul) return the int32 accumulator
sum((x - zx) * (w - zw)) (+ int32 bias); padding is a real zero (zx in the integer domain).
Reference kernels compute in float64, which is exact for every int32 sum: each product is
< 2^16 and every partial sum of a non-overflowing accumulator is < 2^53. A sum that leaves the
int32 range raises instead of wrapping (the lowering pass proves it cannot happen first).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .. import numerics

_NS = "qlower"


def _axis(axis: Optional[int]) -> Optional[int]:
    return None if axis is None or axis < -16 else axis


# ------------------------------------------------------------------------------ quant ops
@torch.library.custom_op(f"{_NS}::quantize", mutates_args=())
def quantize(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmin: int, qmax: int,
             dtype: torch.dtype, axis: Optional[int] = None) -> torch.Tensor:
    return numerics.quantize(x, scale, zero_point, qmin, qmax, dtype, _axis(axis))


@quantize.register_fake
def _(x, scale, zero_point, qmin, qmax, dtype, axis=None):
    return x.new_empty(x.shape, dtype=dtype)


@torch.library.custom_op(f"{_NS}::dequantize", mutates_args=())
def dequantize(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
               axis: Optional[int] = None) -> torch.Tensor:
    return numerics.dequantize(q, scale, zero_point, _axis(axis))


@dequantize.register_fake
def _(q, scale, zero_point, axis=None):
    return q.new_empty(q.shape, dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::requantize", mutates_args=())
def requantize(acc: torch.Tensor, acc_scale: torch.Tensor, out_scale: float, out_zp: int,
               qmin: int, qmax: int, dtype: torch.dtype, axis: Optional[int] = None,
               profile: str = "float") -> torch.Tensor:
    return numerics.requantize(acc, acc_scale, out_scale, out_zp, qmin, qmax, dtype,
                               _axis(axis), profile)  # type: ignore[arg-type]


@requantize.register_fake
def _(acc, acc_scale, out_scale, out_zp, qmin, qmax, dtype, axis=None, profile="float"):
    return acc.new_empty(acc.shape, dtype=dtype)


# ------------------------------------------------------------------------ accumulating ops
def _centered(q: torch.Tensor, zp: torch.Tensor | int, axis: int | None = None) -> torch.Tensor:
    zp_t = torch.as_tensor(zp, dtype=torch.float64)
    if axis is not None and zp_t.numel() > 1:
        shape = [1] * q.dim()
        shape[axis] = zp_t.numel()
        zp_t = zp_t.reshape(shape)
    else:
        zp_t = zp_t.reshape(())
    return q.to(torch.float64) - zp_t


def _to_int32(acc: torch.Tensor, bias: Optional[torch.Tensor], bias_axis: int, op: str) -> torch.Tensor:
    if bias is not None:
        shape = [1] * acc.dim()
        shape[bias_axis] = bias.numel()
        acc = acc + bias.to(torch.float64).reshape(shape)
    if acc.numel() and (acc.max().item() > numerics.INT32_MAX or acc.min().item() < numerics.INT32_MIN):
        raise OverflowError(f"qlower::{op}: int32 accumulator overflow")
    return acc.to(torch.int32)


@torch.library.custom_op(f"{_NS}::conv2d", mutates_args=())
def conv2d(x: torch.Tensor, x_zp: int, w: torch.Tensor, w_zp: torch.Tensor, bias: Optional[torch.Tensor],
           stride: list[int], padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    acc = F.conv2d(_centered(x, x_zp), _centered(w, w_zp, 0), None, stride, padding, dilation, groups)
    return _to_int32(acc, bias, 1, "conv2d")


@conv2d.register_fake
def _(x, x_zp, w, w_zp, bias, stride, padding, dilation, groups):
    return F.conv2d(x.to(torch.float32), w.to(torch.float32), None, stride, padding, dilation,
                    groups).to(torch.int32)


@torch.library.custom_op(f"{_NS}::conv1d", mutates_args=())
def conv1d(x: torch.Tensor, x_zp: int, w: torch.Tensor, w_zp: torch.Tensor, bias: Optional[torch.Tensor],
           stride: list[int], padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    acc = F.conv1d(_centered(x, x_zp), _centered(w, w_zp, 0), None, stride, padding, dilation, groups)
    return _to_int32(acc, bias, 1, "conv1d")


@conv1d.register_fake
def _(x, x_zp, w, w_zp, bias, stride, padding, dilation, groups):
    return F.conv1d(x.to(torch.float32), w.to(torch.float32), None, stride, padding, dilation,
                    groups).to(torch.int32)


@torch.library.custom_op(f"{_NS}::linear", mutates_args=())
def linear(x: torch.Tensor, x_zp: int, w: torch.Tensor, w_zp: torch.Tensor,
           bias: Optional[torch.Tensor]) -> torch.Tensor:
    return _linear_accumulator(x, x_zp, w, w_zp, bias, "linear")


def _linear_accumulator(x, x_zp, w, w_zp, bias, op: str) -> torch.Tensor:
    """int32 sum((x - zx) * (w - zw)) over the last dim (+ int32 bias), w [out, in]."""
    acc = torch.matmul(_centered(x, x_zp), _centered(w, w_zp, 0).t())
    return _to_int32(acc, bias, acc.dim() - 1, op)


@linear.register_fake
def _(x, x_zp, w, w_zp, bias):
    return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=torch.int32)


@torch.library.custom_op(f"{_NS}::matmul", mutates_args=())
def matmul(a: torch.Tensor, a_zp: int, b: torch.Tensor, b_zp: int) -> torch.Tensor:
    return _to_int32(torch.matmul(_centered(a, a_zp), _centered(b, b_zp)), None, 0, "matmul")


@matmul.register_fake
def _(a, a_zp, b, b_zp):
    return torch.matmul(a.to(torch.float32), b.to(torch.float32)).to(torch.int32)


# ---------------------------------------------------------------- elementwise quantized ops
def _binary(op, a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, qmin, qmax, dtype):
    # Defined through the canonical dequantize / quantize: y = Q(op(DQ(a), DQ(b))) in fp32.
    y = op(numerics.dequantize(a, a_scale, a_zp), numerics.dequantize(b, b_scale, b_zp))
    return numerics.quantize(y, out_scale, out_zp, qmin, qmax, dtype)


@torch.library.custom_op(f"{_NS}::add", mutates_args=())
def add(a: torch.Tensor, a_scale: float, a_zp: int, b: torch.Tensor, b_scale: float, b_zp: int,
        out_scale: float, out_zp: int, qmin: int, qmax: int, dtype: torch.dtype) -> torch.Tensor:
    return _binary(torch.add, a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, qmin, qmax, dtype)


@add.register_fake
def _(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, qmin, qmax, dtype):
    return torch.empty(torch.broadcast_shapes(a.shape, b.shape), dtype=dtype, device=a.device)


@torch.library.custom_op(f"{_NS}::mul", mutates_args=())
def mul(a: torch.Tensor, a_scale: float, a_zp: int, b: torch.Tensor, b_scale: float, b_zp: int,
        out_scale: float, out_zp: int, qmin: int, qmax: int, dtype: torch.dtype) -> torch.Tensor:
    return _binary(torch.mul, a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, qmin, qmax, dtype)


@mul.register_fake
def _(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, qmin, qmax, dtype):
    return torch.empty(torch.broadcast_shapes(a.shape, b.shape), dtype=dtype, device=a.device)


# ------------------------------------------------------------ integer pass-through ops
@torch.library.custom_op(f"{_NS}::max_pool2d", mutates_args=())
def max_pool2d(q: torch.Tensor, kernel_size: list[int], stride: list[int], padding: list[int],
               dilation: list[int], ceil_mode: bool) -> torch.Tensor:
    # Integers up to 2^24 are exact in fp32, and max commutes with the monotone Q/DQ maps.
    y = F.max_pool2d(q.to(torch.float32), kernel_size, stride or kernel_size, padding, dilation,
                     ceil_mode)
    return y.to(q.dtype)


@max_pool2d.register_fake
def _(q, kernel_size, stride, padding, dilation, ceil_mode):
    return F.max_pool2d(q.to(torch.float32), kernel_size, stride or kernel_size, padding, dilation,
                        ceil_mode).to(q.dtype)


@torch.library.custom_op(f"{_NS}::mean", mutates_args=())
def mean(q: torch.Tensor, zero_point: int, dims: list[int], keepdim: bool, qmin: int, qmax: int) -> torch.Tensor:
    """Integer mean over `dims` (global average pooling), qparams unchanged; see numerics.mean_integer."""
    return numerics.mean_integer(q, zero_point, [d % q.dim() for d in dims], keepdim, qmin, qmax, q.dtype)


@mean.register_fake
def _(q, zero_point, dims, keepdim, qmin, qmax):
    return torch.sum(q.to(torch.float32), dim=[d % q.dim() for d in dims], keepdim=keepdim).to(q.dtype)


@torch.library.custom_op(f"{_NS}::table", mutates_args=())
def table(q: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """8-bit lookup: table[q - dtype_min(q)] (numerics.table_lookup); one entry per code."""
    return numerics.table_lookup(q, table)


@table.register_fake
def _(q, table):
    return q.new_empty(q.shape, dtype=table.dtype)


@torch.library.custom_op(f"{_NS}::layer_norm_integer", mutates_args=())
def layer_norm_integer(q: torch.Tensor, scale: float, zero_point: int, weight: Optional[torch.Tensor],
                       bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """LayerNorm over the last dim of an 8-bit value from exact integer statistics, fp32 out
    (numerics.layer_norm_integer)."""
    return numerics.layer_norm_integer(q, scale, zero_point, weight, bias, eps)


@layer_norm_integer.register_fake
def _(q, scale, zero_point, weight, bias, eps):
    return q.new_empty(q.shape, dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::rms_norm_integer", mutates_args=())
def rms_norm_integer(q: torch.Tensor, scale: float, zero_point: int, weight: Optional[torch.Tensor],
                     eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of an 8-bit value from an exact integer sum of squares, fp32 out
    (numerics.rms_norm_integer)."""
    return numerics.rms_norm_integer(q, scale, zero_point, weight, eps)


@rms_norm_integer.register_fake
def _(q, scale, zero_point, weight, eps):
    return q.new_empty(q.shape, dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::softmax_integer", mutates_args=())
def softmax_integer(q: torch.Tensor, table: torch.Tensor, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Softmax over the last dim of an 8-bit value from an int32 exp table, fp32 out; `keep`
    (bool, broadcastable to q) masks entries out (numerics.softmax_integer)."""
    return numerics.softmax_integer(q, table, keep)


@softmax_integer.register_fake
def _(q, table, keep=None):
    return q.new_empty(q.shape, dtype=torch.float32)


# ------------------------------------------------------ per-token dynamic quantization
@torch.library.custom_op(f"{_NS}::token_scale", mutates_args=())
def token_scale(x: torch.Tensor) -> torch.Tensor:
    """Per-row scale of a per-token quantized activation, [..., 1] (numerics.per_token_scale)."""
    return numerics.per_token_scale(x)


@token_scale.register_fake
def _(x):
    return x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::quantize_per_token", mutates_args=())
def quantize_per_token(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return numerics.quantize_per_token(x, scale)


@quantize_per_token.register_fake
def _(x, scale):
    return x.new_empty(x.shape, dtype=torch.uint8)


@torch.library.custom_op(f"{_NS}::dequantize_per_token", mutates_args=())
def dequantize_per_token(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return numerics.dequantize_per_token(q, scale)


@dequantize_per_token.register_fake
def _(q, scale):
    return q.new_empty(q.shape, dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::dequantize_per_token_acc", mutates_args=())
def dequantize_per_token_acc(acc: torch.Tensor, scale: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """int32 accumulator of a per-token linear -> fp32 (numerics.dequantize_per_token_accumulator)."""
    return numerics.dequantize_per_token_accumulator(acc, scale, weight_scale)


@dequantize_per_token_acc.register_fake
def _(acc, scale, weight_scale):
    return acc.new_empty(acc.shape, dtype=torch.float32)


# ------------------------------------------------------ per-tensor dynamic quantization
@torch.library.custom_op(f"{_NS}::quantize_dynamic", mutates_args=())
def quantize_dynamic(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q uint8, scale 0-d fp32, zero point 0-d uint8) of x, computed at run time
    (numerics.quantize_dynamic: ONNX DynamicQuantizeLinear)."""
    return numerics.quantize_dynamic(x)


@quantize_dynamic.register_fake
def _(x):
    return (x.new_empty(x.shape, dtype=torch.uint8), x.new_empty((), dtype=torch.float32),
            x.new_empty((), dtype=torch.uint8))


@torch.library.custom_op(f"{_NS}::dequantize_dynamic", mutates_args=())
def dequantize_dynamic(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
    return numerics.dequantize(q, scale, zero_point)


@dequantize_dynamic.register_fake
def _(q, scale, zero_point):
    return q.new_empty(q.shape, dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::linear_dynamic", mutates_args=())
def linear_dynamic(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, w: torch.Tensor,
                   w_zp: torch.Tensor, w_scale: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """A linear layer on a dynamically quantized input: the int32 accumulator
    sum((q - zp) * (w - zw)) dequantized as numerics.dequantize_dynamic_accumulator (+ bias)."""
    acc = _linear_accumulator(q, zero_point, w, w_zp, None, "linear_dynamic")
    return numerics.dequantize_dynamic_accumulator(acc, scale, w_scale, bias)


@linear_dynamic.register_fake
def _(q, scale, zero_point, w, w_zp, w_scale, bias):
    return q.new_empty((*q.shape[:-1], w.shape[0]), dtype=torch.float32)
