"""ONNX translations of qlower's integer ops, all bit-exact against the `float` numerics profile
(the tests compare every element with the reference backend, on both CPU formulations):

- requantize:        Cast(float) -> Mul(M) -> QuantizeLinear(scale 1, zp) [-> Clip]:
                     RNE(fp32(acc) * M) + zp, saturated — the canonical formula, M = fp32(s_acc / sy).
- conv / linear:     ConvInteger / MatMulInteger with s8 weights where exact on this CPU (VNNI or
                     7-bit weights), else u8 weights (w + 128, zero point 128, exact on AVX2) + bias.
- matmul:            MatMulInteger.
- *_requant (fused): QLinearConv; com.microsoft QGemm (with bias, 2-D view) or QLinearMatMul
                     (without); QLinearMatMul for u8 x u8 — each with X_scale = 1 and
                     W_scale = s_acc, so ONNX Runtime's multiplier is exactly the canonical M.
- linear_dequant (fused, float output): com.microsoft QGemm without Y_scale (int32 bias C, 2-D
                     view) or MatMulIntegerToFloat (no bias), X_scale = 1, W_scale = s_acc.
- linear_per_token (fused): MatMulIntegerToFloat, A_scale = the token scale per row.
- quantize_dynamic / linear_dynamic: DynamicQuantizeLinear / MatMulIntegerToFloat with the bias,
                     which the session fuses into one DynamicQuantizeMatMul per linear.
- add:               com.microsoft QLinearAdd where kernel_proofs shows it equal to the canonical
                     add on all 65,536 input pairs; else DequantizeLinear x2 -> Add -> QuantizeLinear.
- mean over H, W:    com.microsoft QLinearGlobalAveragePool where proven for every possible sum;
                     else int32 ReduceSum -> Div -> QuantizeLinear.
- table (8-bit lookup): GatherElements on the flattened codes.
- quantize / dequantize: QuantizeLinear (true fp32 division, RNE) / DequantizeLinear.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import onnx_ir as ir
import torch
from torch.fx import Node

from ... import numerics
from ...ops import fused  # noqa: F401  (registers the qlower_ort ops translated here)
from ...fx import constant_value, full_args
from ...core.cpu import has_vnni, s8_weights_exact
from ..kernel_proofs import qlinear_add_exact, qlinear_global_average_pool_exact
from .table import lowers
from .onnx_ops import (first_output, MatMulIntegerToFloat, QGemm, QLinearAdd, QLinearGlobalAveragePool, const, i64,
                       np_dtype, np_of, op, value_of, contrib_ops_allowed)

q = torch.ops.qlower
ort = torch.ops.qlower_ort
_FLOAT, _INT32 = 1, 6   # ONNX TensorProto data types


# ------------------------------------------------------------------------------ capability
def _quantize_natural_range(node: Node) -> str | None:
    """natural dtype range"""
    a = full_args(node)
    return None if (a[3], a[4]) == numerics.dtype_range(a[5]) else "quantize with a narrowed range is not emitted"


def _float_profile(node: Node) -> str | None:
    """'float' numerics profile only"""
    return None if full_args(node)[8] == "float" else "onnxruntime reproduces only the 'float' requantization profile"


def u8_first_operand(node: Node) -> str | None:
    """uint8 first operand (what the translation emits; engines that accumulate exactly share it)"""
    if node.args[0].meta["val"].dtype != torch.uint8:
        return "MatMulInteger is emitted for uint8 first operands only"
    return None


def _matmul_operands(node: Node) -> str | None:
    """u8 x u8 (exact on AVX2) or VNNI"""
    if (why := u8_first_operand(node)) is not None:
        return why
    if node.args[2].meta["val"].dtype == torch.int8 and not has_vnni():
        return "u8 x full-range s8 activations saturate on AVX2 without VNNI"
    return None


def _constant_weights(node: Node) -> str | None:
    """constant weights with one zero point"""
    w, w_zp = node.args[2], node.args[3]
    if getattr(w, "op", None) != "get_attr" or getattr(w_zp, "op", None) != "get_attr":
        return "weights must be constants"
    gm = w.graph.owning_module
    zp = constant_value(gm, w_zp) if gm is not None else None
    if zp is not None and zp.unique().numel() != 1:
        return "per-channel weight zero points are not emitted"
    return None


def _mean_small(node: Node) -> str | None:
    """reduced element count below 2^15 (keeps the fp32 quotient's rounding exact)"""
    shape, dims = node.args[0].meta["val"].shape, node.args[2]
    if any(not isinstance(shape[d], int) for d in dims):
        return "mean over a symbolic dimension"
    return None if math.prod(shape[d] for d in dims) < 2**15 else "mean over too many elements for exact fp32 rounding"


# ------------------------------------------------------------------------------ helpers
def _clamped(y, lo: int, hi: int, dtype) -> object:
    """y through a Clip to [lo, hi] where that is narrower than the dtype's range (a fused
    relu/clamp: exact, since quantize is monotone). Bounds are in y's integer type."""
    np_t = np_of(dtype)
    if (lo, hi) == (np.iinfo(np_t).min, np.iinfo(np_t).max):
        return y
    return op.Clip(y, const(lo, np_t), const(hi, np_t))


def _per_axis(values: np.ndarray, rank: int, axis: Optional[int]) -> np.ndarray:
    """A per-channel vector shaped to broadcast along `axis` of a rank-`rank` tensor; a scalar
    for per-tensor values."""
    values = values.reshape(-1)
    if values.size == 1 or axis is None:
        return values.reshape(())
    shape = [1] * rank
    shape[axis % rank] = values.size
    return values.reshape(shape)


def _zero_point(zp, like) -> object:
    return const(zp, np_dtype(like))


def _weights(x, w, w_zp, transpose: bool) -> tuple[object, object]:
    """(weight, zero point) constants in the formulation that is exact on this CPU for x."""
    wt, zp = _weight_formulation(x, w, w_zp, transpose)
    return const(wt, wt.dtype), const(zp, zp.dtype)


def _weight_formulation(x, w, w_zp, transpose: bool) -> tuple[np.ndarray, np.ndarray]:
    """(weight, scalar zero point) arrays in a formulation exact on this CPU for activations x:
    s8 where `cpu.s8_weights_exact` says so (always for int8 x), else u8 (w + 128, zero point +
    128: exact u8 x u8 on AVX2). Never u8 weights against int8 x: ConvInteger of s8 x by u8
    weights saturates without VNNI (42-55 of 80 outputs wrong on an AVX2-only AMD EPYC;
    tests/test_fuzz.py::test_regression_int8_activations_conv_without_vnni)."""
    wv, zp = value_of(w), int(value_of(w_zp).reshape(-1)[0])
    wt = wv.T if transpose else wv
    if wv.dtype == np.uint8:
        # already u8 (a matmul's constant operand quantized as an activation, asymmetric):
        # u8 x u8 is exact as is; the +128 re-encoding below is for s8 values only (it wrapped
        # these mod 256: tests/test_fuzz.py::test_regression_matmul_constant_uint8_operand)
        return wt.astype(np.uint8), np.array(zp, np.uint8)
    if wv.dtype == np.int8 and s8_weights_exact(int(wv.min(initial=0)), int(wv.max(initial=0)),
                                                int8_activations=np_dtype(x) == np.int8):
        return wt.astype(np.int8), np.array(zp, np.int8)
    return (wt.astype(np.int32) + 128).astype(np.uint8), np.array(zp + 128, np.uint8)


def _add_bias(acc, bias, spatial_dims: int):
    """acc + int32 bias along the channel axis (followed by `spatial_dims` dims)."""
    if bias is None:
        return acc
    b = value_of(bias).astype(np.int32).reshape(-1)
    return op.Add(acc, const(b.reshape([-1] + [1] * spatial_dims)))


# ------------------------------------------------------------------------------ Q / DQ / requantize
@lowers(q.quantize.default, when=_quantize_natural_range)
def quantize(x, scale, zero_point, qmin: int, qmax: int, dtype: int, axis: Optional[int] = None):
    sc, zp = value_of(scale).reshape(-1), value_of(zero_point).reshape(-1)
    attrs = {"axis": axis} if axis is not None and sc.size > 1 else {}
    squeeze = (lambda v: v.reshape(())) if sc.size == 1 else (lambda v: v)
    return op.QuantizeLinear(x, const(squeeze(sc), np.float32), const(squeeze(zp), np_of(dtype)), **attrs)


@lowers(q.dequantize.default)
def dequantize(x, scale, zero_point, axis: Optional[int] = None):
    sc, zp = value_of(scale).reshape(-1), value_of(zero_point).reshape(-1)
    per_channel = sc.size > 1
    if np_dtype(x) == np.int32:
        # An int32 accumulator: fp32(acc - zp) * s as Cast and Mul, the same values. ONNX
        # Runtime's transpose optimizer pushes a Transpose through DequantizeLinear by inserting a
        # QuantizeLinear with the int32 zero point, which no QuantizeLinear accepts: the session
        # failed to build (attention output -> DQ -> transpose -> per-token o_proj, zoo bert).
        centered = x if not zp.any() else op.Sub(x, const(_per_axis(zp.astype(np.int32), len(x.shape), axis)))
        return op.Mul(op.Cast(centered, to=_FLOAT), const(_per_axis(sc.astype(np.float32), len(x.shape), axis)))
    attrs = {"axis": axis % len(x.shape)} if axis is not None and per_channel else {}
    squeeze = (lambda v: v) if per_channel else (lambda v: v.reshape(()))
    return op.DequantizeLinear(x, const(squeeze(sc), np.float32), const(squeeze(zp), np_dtype(x)), **attrs)


@lowers(q.requantize.default, when=_float_profile)
def requantize(acc, acc_scale, out_scale: float, out_zp: int, qmin: int, qmax: int, dtype: int,
               axis: Optional[int] = None, profile: str = "float"):
    m = numerics.float_multiplier(torch.from_numpy(value_of(acc_scale)), out_scale).numpy()
    v = op.Mul(op.Cast(acc, to=_FLOAT), const(_per_axis(m, len(acc.shape), axis), np.float32))
    y = op.QuantizeLinear(v, const(1.0, np.float32), const(out_zp, np_of(dtype)))
    return _clamped(y, qmin, qmax, dtype)


# ------------------------------------------------------------------------------ accumulating ops
@lowers(q.conv2d.default, q.conv1d.default, when=_constant_weights)
def conv(x, x_zp: int, w, w_zp, bias, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
         groups: int):
    wn, zn = _weights(x, w, w_zp, transpose=False)
    acc = op.ConvInteger(x, wn, _zero_point(x_zp, x), zn, strides=list(stride), pads=list(padding) * 2,
                         dilations=list(dilation), group=groups)
    return _add_bias(acc, bias, len(w.shape) - 2)


@lowers(q.linear.default, when=_constant_weights)
def linear(x, x_zp: int, w, w_zp, bias):
    wn, zn = _weights(x, w, w_zp, transpose=True)
    return _add_bias(op.MatMulInteger(x, wn, _zero_point(x_zp, x), zn), bias, 0)


@lowers(q.matmul.default, when=_matmul_operands)
def matmul(a, a_zp: int, b, b_zp: int):
    return op.MatMulInteger(a, b, _zero_point(a_zp, a), _zero_point(b_zp, b))


def _column_scales(acc_scale, zero_point: np.ndarray) -> tuple[object, object]:
    """(W_scale = s_acc, W's zero point) of a fused kernel: scalars, or one per output column
    with the zero point repeated to the scale's shape (QGemm checks that they match)."""
    s = value_of(acc_scale).reshape(-1).astype(np.float32)
    if s.size == 1:
        return const(s.reshape(()), np.float32), const(zero_point, zero_point.dtype)
    return const(s, np.float32), const(np.full(s.size, zero_point, zero_point.dtype), zero_point.dtype)


def _fused_scales(acc_scale, out_scale: float, out_zp: int):
    """(w_scale = s_acc, w_zp = 0, y_scale, y_zp) operands of the fused kernels."""
    w_scale, w_zp = _column_scales(acc_scale, np.array(0, np.int8))
    return w_scale, w_zp, const(out_scale, np.float32), const(out_zp, np.uint8)


@lowers(ort.conv_requant.default)
def conv_requant(x, x_zp: int, w, w_zp, bias, stride: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int], groups: int, acc_scale, out_scale: float, out_zp: int, qmin: int,
                 qmax: int, dtype: int, axis: Optional[int] = None):
    w_scale, w_zp0, y_scale, y_zp = _fused_scales(acc_scale, out_scale, out_zp)
    inputs = [x, const(1.0, np.float32), const(x_zp, np.uint8), const(value_of(w), np.int8), w_scale, w_zp0,
              y_scale, y_zp]
    if bias is not None:
        inputs.append(const(value_of(bias), np.int32))
    y = op.QLinearConv(*inputs, strides=list(stride), pads=list(padding) * 2, dilations=list(dilation),
                       group=groups)
    return _clamped(y, qmin, qmax, dtype)


@lowers(ort.linear_requant.default)
def linear_requant(x, x_zp: int, w, w_zp, bias, acc_scale, out_scale: float, out_zp: int, qmin: int, qmax: int,
                   dtype: int, axis: Optional[int] = None):
    """QGemm with a bias (on a 2-D view of the input); QLinearMatMul without one (N-D input)."""
    wv = value_of(w)
    w_scale, w_zp0, y_scale, y_zp = _fused_scales(acc_scale, out_scale, out_zp)
    x_scale, x_zp_c, w_t = const(1.0, np.float32), const(x_zp, np.uint8), const(wv.T, np.int8)
    if bias is None:
        return _clamped(op.QLinearMatMul(x, x_scale, x_zp_c, w_t, w_scale, w_zp0, y_scale, y_zp), qmin, qmax, dtype)
    rank, k, n = len(x.shape), wv.shape[1], wv.shape[0]
    rows = x if rank == 2 else op.Reshape(x, i64([-1, k]))
    y = QGemm(rows, x_scale, x_zp_c, w_t, w_scale, w_zp0, const(value_of(bias), np.int32), y_scale, y_zp)
    if rank != 2:
        y = op.Reshape(y, op.Concat(op.Shape(x, end=-1), i64([n]), axis=0))
    return _clamped(y, qmin, qmax, dtype)


@lowers(ort.linear_dequant.default)
def linear_dequant(x, x_zp: int, w, w_zp, bias, acc_scale, acc_zp, axis: Optional[int] = None):
    """fp32(fp32(acc + bias) * s_acc) in one kernel (fuse_dequantize.py): QGemm without an output
    scale on a 2-D view where there is a bias (its int32 C joins the accumulator), else
    MatMulIntegerToFloat on the input as it is. A_scale 1, B_scale s_acc, zero points in the
    weight formulation that is exact on this CPU."""
    if not contrib_ops_allowed():
        return dequantize(linear(x, x_zp, w, w_zp, bias), acc_scale, acc_zp, axis)
    wt, zp = _weight_formulation(x, w, w_zp, transpose=True)
    w_scale, w_zp_c = _column_scales(acc_scale, zp)
    if bias is None:
        return MatMulIntegerToFloat(x, const(wt, wt.dtype), const(1.0, np.float32), w_scale, _zero_point(x_zp, x),
                                    w_zp_c)
    rank, n = len(x.shape), wt.shape[1]
    rows = x if rank == 2 else op.Reshape(x, i64([-1, wt.shape[0]]))
    y = QGemm(rows, const(1.0, np.float32), _zero_point(x_zp, x), const(wt, wt.dtype), w_scale, w_zp_c,
              const(value_of(bias).astype(np.int32).reshape(-1), np.int32))
    return y if rank == 2 else op.Reshape(y, op.Concat(op.Shape(x, end=-1), i64([n]), axis=0))


@lowers(ort.matmul_requant.default)
def matmul_requant(a, a_zp: int, b, b_zp: int, acc_scale, out_scale: float, out_zp: int, qmin: int, qmax: int,
                   dtype: int, axis: Optional[int] = None):
    s = float(value_of(acc_scale).reshape(()))
    y = op.QLinearMatMul(a, const(1.0, np.float32), const(a_zp, np.uint8), b, const(s, np.float32),
                         const(b_zp, np.uint8), const(out_scale, np.float32), const(out_zp, np_of(dtype)))
    return _clamped(y, qmin, qmax, dtype)


# ------------------------------------------------------------------------------ elementwise
def _same_shape(a, b) -> bool:
    return len(a.shape) == len(b.shape) and all(x == y for x, y in zip(a.shape, b.shape))


def _dq_op_q(opname: str, a, a_scale: float, a_zp: int, b, b_scale: float, b_zp: int, out_scale: float,
            out_zp: int, qmin: int, qmax: int, dtype: int):
    """Q(DQ(a) <op> DQ(b)): the canonical definition, in ONNX's exact Q/DQ kernels."""
    da = op.DequantizeLinear(a, const(a_scale, np.float32), _zero_point(a_zp, a))
    db = op.DequantizeLinear(b, const(b_scale, np.float32), _zero_point(b_zp, b))
    s = getattr(op, opname)(da, db)
    return _clamped(op.QuantizeLinear(s, const(out_scale, np.float32), const(out_zp, np_of(dtype))), qmin, qmax, dtype)


@lowers(q.add.default)
def add(a, a_scale: float, a_zp: int, b, b_scale: float, b_zp: int, out_scale: float, out_zp: int,
        qmin: int, qmax: int, dtype: int):
    u8 = ir.DataType.UINT8
    if contrib_ops_allowed() and a.dtype == b.dtype == u8 and np_of(dtype) == np.uint8 and _same_shape(a, b) \
            and qlinear_add_exact(a_scale, a_zp, b_scale, b_zp, out_scale, out_zp):
        y = QLinearAdd(a, const(a_scale, np.float32), const(a_zp, np.uint8), b, const(b_scale, np.float32),
                       const(b_zp, np.uint8), const(out_scale, np.float32), const(out_zp, np.uint8))
        return _clamped(y, qmin, qmax, dtype)
    return _dq_op_q("Add", a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, qmin, qmax, dtype)


@lowers(q.mul.default)
def mul(a, a_scale: float, a_zp: int, b, b_scale: float, b_zp: int, out_scale: float, out_zp: int,
        qmin: int, qmax: int, dtype: int):
    return _dq_op_q("Mul", a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, qmin, qmax, dtype)


# ------------------------------------------------------------------------------ pass-through ops
@lowers(q.max_pool2d.default)
def max_pool2d(x, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int],
               dilation: Sequence[int], ceil_mode: bool):
    y = op.MaxPool(x, kernel_shape=list(kernel_size), strides=list(stride or kernel_size),
                   pads=list(padding) * 2, dilations=list(dilation), ceil_mode=int(ceil_mode))
    return first_output(y)


def _global_pool_proven(x, zero_point: int, dims: Sequence[int], qmin: int, qmax: int) -> bool:
    shape = x.shape
    if not contrib_ops_allowed():   # standard ONNX only (the openvino backend)
        return False
    if x.dtype != ir.DataType.UINT8 or len(shape) != 4 or {d % 4 for d in dims} != {2, 3} or (qmin, qmax) != (0, 255):
        return False
    if not all(isinstance(d, int) for d in (shape[2], shape[3])):
        return False
    return qlinear_global_average_pool_exact(int(shape[2] * shape[3]), 1.0, int(zero_point))


@lowers(q.mean.default, when=_mean_small)
def mean(x, zero_point: int, dims: Sequence[int], keepdim: bool, qmin: int, qmax: int):
    """Integer mean (numerics.mean_integer): QLinearGlobalAveragePool (scale 1 in and out) where
    proven equal for every possible sum, else sum in int32 and divide in fp32 — fp32(S / N) is
    exact or at least 1/(2N) away from a tie while |S| < 2^23, so QuantizeLinear's RNE of it is
    the exact half-to-even quotient."""
    rank = len(x.shape)
    if _global_pool_proven(x, zero_point, dims, qmin, qmax):
        one, z = const(1.0, np.float32), const(zero_point, np.uint8)
        pooled = QLinearGlobalAveragePool(x, one, z, one, z, channels_last=0)
        return pooled if keepdim else op.Squeeze(pooled, i64([2, 3]))
    axes = [d % rank for d in dims]
    n = int(np.prod([x.shape[d] for d in axes]))
    centered = op.Sub(op.Cast(x, to=_INT32), const(zero_point, np.int32))
    total = op.ReduceSum(centered, i64(axes), keepdims=int(keepdim))
    v = op.Div(op.Cast(total, to=_FLOAT), const(float(n), np.float32))
    return op.QuantizeLinear(v, const(1.0, np.float32), const(zero_point, np_dtype(x)))


def _lookup(entries: np.ndarray, index):
    """entries[index] for an int32 index tensor of any shape: GatherElements on the table as one
    [1, 256] row and the index flattened to [1, n], reshaped back. ONNX Runtime's Gather copies
    element by element (measured, one thread: 139-175 us for 16,384 one-byte lookups, index and
    table type alike); GatherElements on the same data took 34 us."""
    flat = op.Reshape(index, i64([1, -1]))
    looked_up = op.GatherElements(const(entries.reshape(1, -1)), flat, axis=1)
    return op.Reshape(looked_up, op.Shape(index))


@lowers(q.table.default)
def table(x, table):
    """8-bit lookup (numerics.table_lookup) on the codes cast to int32. uint8 codes index the
    table as they are; int8 codes index it rotated by 128, since GatherElements counts a negative
    index from the end (q = -128 reads entry 128 of the rotated table: T[0]) — no Add."""
    entries = value_of(table)
    if x.dtype == ir.DataType.INT8:
        entries = np.roll(entries, -128)
    return _lookup(entries, op.Cast(x, to=_INT32))


_INT64 = 7


@lowers(q.layer_norm_integer.default)
def layer_norm_integer(x, scale: float, zero_point: int, weight, bias, eps: float):
    """numerics.layer_norm_integer. The statistics: for N <= 258 every partial sum of d and d^2
    stays below 2^24, so fp32 holds them exactly and the fused fp32 kernels compute them —
    DequantizeLinear(scale 1) for d, ReduceSum, ReduceSumSquare, N*d - S1 — the same integers
    the int32 path gives (measured, zoo transformer int8 b8, one thread: four LayerNorms cost
    0.20 ms more than ORT's own LayerNormalization through the int32 path); else int32 sums. Then
    the int64 variance, Cast, Add, Sqrt (ONNX Runtime's is correctly rounded: 0 of 4096 differ
    from numpy's), Div, Mul, Add: single IEEE operations in separate kernels, which ONNX Runtime
    never fuses into an FMA, so the clamp of y * w is left out where it cannot bind (|w| * sqrt(N)
    below FLT_MAX, the largest |y| being sqrt(N - 1))."""
    return _integer_norm(x, scale, zero_point, weight, bias, eps, centered=True)


@lowers(q.rms_norm_integer.default)
def rms_norm_integer(x, scale: float, zero_point: int, weight, eps: float):
    """numerics.rms_norm_integer: the LayerNorm's lowering without S1 (t = N*d, V = N*S2); the
    largest |y| is sqrt(N), so the same clamp rule holds."""
    return _integer_norm(x, scale, zero_point, weight, None, eps, centered=False)


def _integer_norm(x, scale: float, zero_point: int, weight, bias, eps: float, centered: bool):
    n = int(x.shape[-1])
    exact_in_fp32 = n * 255 ** 2 < 2 ** 24
    if exact_in_fp32:
        d = op.DequantizeLinear(x, const(1.0, np.float32), const(zero_point, np_dtype(x)))
        s1 = op.ReduceSum(d, i64([-1]), keepdims=1) if centered else None
        s2 = op.ReduceSumSquare(d, i64([-1]), keepdims=1)
        t = op.Mul(d, const(float(n), np.float32))
    else:
        d = op.Sub(op.Cast(x, to=_INT32), const(zero_point, np.int32))
        s1 = op.ReduceSum(d, i64([-1]), keepdims=1) if centered else None
        s2 = op.ReduceSum(op.Mul(d, d), i64([-1]), keepdims=1)
        t = op.Mul(d, const(n, np.int32))
    v = op.Mul(op.Cast(s2, to=_INT64), const(n, np.int64))
    if centered:
        t = op.Sub(t, s1)
        s1_wide = op.Cast(s1, to=_INT64)
        v = op.Sub(v, op.Mul(s1_wide, s1_wide))
    if not exact_in_fp32:
        t = op.Cast(t, to=_FLOAT)
    total = op.Add(op.Cast(v, to=_FLOAT), const(numerics.layer_norm_eps_term(scale, n, eps), np.float32))
    y = op.Div(t, op.Sqrt(total))
    if weight is not None:
        y = op.Mul(y, weight)
        w = value_of(weight)
        finite = float(np.finfo(np.float32).max)
        if w is None or float(np.abs(w).max()) * math.sqrt(n) >= finite:
            y = op.Clip(y, const(-finite, np.float32), const(finite, np.float32))
    if bias is not None:
        y = op.Add(y, bias)
    return y


@lowers(q.softmax_integer.default)
def softmax_integer(x, table, keep=None):
    """numerics.softmax_integer: int32 ReduceMax and Sub give k = max - q, a lookup reads the
    int32 exp table (_lookup), int32 ReduceSum, then one IEEE Div of the two casts. Masked:
    Where puts the dtype's lowest code at masked entries before the max, k is clipped into the
    table, and masked entries become 0 before the sum."""
    codes = op.Cast(x, to=_INT32)
    if keep is None:
        k = op.Sub(op.ReduceMax(codes, i64([-1]), keepdims=1), codes)
        e = _lookup(value_of(table), k)
    else:
        lo, hi = numerics.dtype_range(torch.uint8 if x.dtype == ir.DataType.UINT8 else torch.int8)
        top = op.ReduceMax(op.Where(keep, codes, const(np.int32(lo))), i64([-1]), keepdims=1)
        k = op.Clip(op.Sub(top, codes), const(np.int32(0)), const(np.int32(hi - lo)))
        e = op.Where(keep, _lookup(value_of(table), k), const(np.int32(0)))
    total = op.ReduceSum(e, i64([-1]), keepdims=1)
    return op.Div(op.Cast(e, to=_FLOAT), op.Cast(total, to=_FLOAT))


# ------------------------------------------------------------ per-token dynamic quantization
# Standard ops only, each IEEE-exact, in the order numerics.py defines: ReduceMax is exact in any
# order, Div is a correctly rounded fp32 division, Round is half-to-even, Mul one fp32 rounding.
@lowers(q.token_scale.default)
def token_scale(x):
    amax = op.ReduceMax(op.Abs(x), i64([-1]), keepdims=1)
    s = op.Div(amax, const(float(numerics.PER_TOKEN_BOUND), np.float32))
    return op.Max(s, const(numerics.PER_TOKEN_MIN_SCALE, np.float32))


@lowers(q.quantize_per_token.default)
def quantize_per_token(x, scale):
    """One blocked QuantizeLinear (opset 21: a scale per row, block = the whole last dim):
    saturate_u8(RNE(x / s_t) + 128), a true fp32 division (tests/test_per_token.py checks ties
    and their neighbours). The zero point must have the scale's shape: a constant where that is
    static, else Expand of 128 (two small nodes; each ORT node costs a few µs on small models).
    Replaced Div, Max(-127), QuantizeLinear(1, 128): two passes over the activation fewer.
    Standard ONNX only (a portable export): numerics.quantize_per_token written out, Div -> Round
    (half to even) -> Clip -> Add(128) -> Cast, because OpenVINO's ONNX frontend cannot read a
    blocked QuantizeLinear whose block is a dynamic dim ("Cannot get length of dynamic
    dimension")."""
    if not contrib_ops_allowed():
        r = op.Clip(op.Round(op.Div(x, scale)), const(float(numerics.PER_TOKEN_QMIN), np.float32),
                    const(float(numerics.PER_TOKEN_BOUND), np.float32))
        return op.Cast(op.Add(r, const(float(numerics.PER_TOKEN_ZERO_POINT), np.float32)), to=2)   # uint8
    shape = scale.shape
    if shape is not None and all(isinstance(d, int) for d in shape):
        zero_point = const(np.full(tuple(shape), numerics.PER_TOKEN_ZERO_POINT, np.uint8))
    else:
        zero_point = op.Expand(const(numerics.PER_TOKEN_ZERO_POINT, np.uint8), op.Shape(scale))
    return op.QuantizeLinear(x, scale, zero_point, axis=-1, block_size=x.shape[-1])


@lowers(q.dequantize_per_token.default)
def dequantize_per_token(x, scale):
    centered = op.Sub(op.Cast(x, to=_INT32), const(numerics.PER_TOKEN_ZERO_POINT, np.int32))
    return op.Mul(op.Cast(centered, to=_FLOAT), scale)


def _weight_scale(weight_scale):
    return const(value_of(weight_scale).reshape(-1), np.float32)


@lowers(q.dequantize_per_token_acc.default)
def dequantize_per_token_acc(acc, scale, weight_scale):
    return op.Mul(op.Mul(op.Cast(acc, to=_FLOAT), _weight_scale(weight_scale)), scale)


@lowers(ort.linear_per_token.default)
def linear_per_token(x, x_zp: int, w, w_zp, token_scale, weight_scale):
    """One MatMulIntegerToFloat: B_scale s_w per column, A_scale the token scale (one per row,
    shape [..., M, 1]). ORT's kernel multiplies fp32(acc) by fp32(1 * s_w) in its GEMM epilogue,
    then the whole output by A_scale (an IEEE multiply per element): exactly the two roundings of
    numerics.dequantize_per_token_accumulator, and one node less than MatMulIntegerToFloat ->
    Mul per linear (zoo vit: 117 -> 108 nodes). A 1-element A_scale would instead be folded
    into the per-column multiplier first (s_t * s_w, another rounding), so a 1-D input keeps the
    Mul. The standard-op form where contrib ops are not allowed."""
    if not contrib_ops_allowed():
        return dequantize_per_token_acc(linear(x, x_zp, w, w_zp, None), token_scale, weight_scale)
    wn, zn = _weights(x, w, w_zp, transpose=True)
    if len(x.shape) >= 2:
        return MatMulIntegerToFloat(x, wn, token_scale, _weight_scale(weight_scale), _zero_point(x_zp, x), zn)
    scaled = MatMulIntegerToFloat(x, wn, const(1.0, np.float32), _weight_scale(weight_scale),
                                  _zero_point(x_zp, x), zn)
    return op.Mul(scaled, token_scale)


# ------------------------------------------------------------ per-tensor dynamic quantization
# ONNX Runtime's DynamicQuantizeLinear and DynamicQuantizeMatMul compute the range, scale and zero
# point as numerics.dynamic_qparams does (min/max exact in any order, one fp32 division each, RNE)
# and quantize through the same MLAS kernel as QuantizeLinear (true division). Measured with
# tests/test_dynamic_quant.py on both CPU formulations.
@lowers(q.quantize_dynamic.default)
def quantize_dynamic(x):
    return op.DynamicQuantizeLinear(x)


@lowers(q.dequantize_dynamic.default)
def dequantize_dynamic(x, scale, zero_point):
    return op.DequantizeLinear(x, scale, zero_point)


@lowers(q.linear_dynamic.default)
def linear_dynamic(x, scale, zero_point, w, w_zp, weight_scale, bias=None):
    """MatMulIntegerToFloat(q, W, s, s_w, zp, zw, b): its kernel multiplies fp32(acc) by the
    per-column fp32(s * s_w), then adds the bias (MLAS's scale-bias output processor: a multiply
    and an add, no fused multiply-add) — numerics.dequantize_dynamic_accumulator. After a
    DynamicQuantizeLinear the session fuses the two into DynamicQuantizeMatMul, the kernel of
    ORT's own `quantize_dynamic` models. The standard-op form where contrib ops are not allowed."""
    wn, zn = _weights(x, w, w_zp, transpose=True)
    w_scale = _weight_scale(weight_scale)
    if contrib_ops_allowed():
        inputs = [x, wn, scale, w_scale, zero_point, zn] + ([bias] if bias is not None else [])
        return MatMulIntegerToFloat(*inputs)
    y = op.Mul(op.Cast(op.MatMulInteger(x, wn, zero_point, zn), to=_FLOAT), op.Mul(scale, w_scale))
    return y if bias is None else op.Add(y, bias)
