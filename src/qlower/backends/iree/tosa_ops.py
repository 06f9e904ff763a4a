"""TOSA lowerings of qlower's integer ops, registered in lowerings.TOSA_LOWERINGS.

Every formula is numerics.py's, written in TOSA/arith so IREE computes the same bits:
- accumulating ops: tosa.conv2d / depthwise_conv2d / matmul with i32 accumulation and the zero
  points as operands (TOSA subtracts them exactly like the reference kernels);
- requantize `fixed`: tosa.rescale scale32, SINGLE_ROUND, (multiplier, shift) from
  numerics.fixed_multiplier, i.e. the TOSA RESCALE the profile is defined as;
- requantize `float`, quantize, dequantize, quantized add/mul: arith on tensors (sitofp, mulf,
  divf, clamp, round-half-to-even as `(r + 1.5 * 2^23) - 1.5 * 2^23` on the clamped value,
  fptosi), because TOSA has no IEEE division and no explicit round-half-to-even; these lower
  to the same single IEEE operations the reference uses (_round_clamp_to_int says why exact);
- weight-only linear: i4/i8 codes dequantized by a linalg.generic (exactly numerics'), the float
  matmul in IREE's order: the reordered-sum profile, not bit-exact (docs/llm.md).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch.fx import Node

from ... import numerics
from ...fx import full_args, schema_name, constant_value
from .lowerings import DYN, INTEGER_DTYPES, dims, integer_input, static_dims, tosa_lowering, kind_of
from ..cluster_sizes import computable_from
from .values import Emitter, Val, offset_of


_QUANT_DTYPES = (torch.int8, torch.uint8)
_RESCALE_LIMIT = 1.0 - 257.0 / 2**31  # scale below which v + zp stays inside int32 (see _requant_check)


# ------------------------------------------------------------------------------- checks
def _const(node: Node, arg) -> torch.Tensor | None:
    return constant_value(node.graph.owning_module, arg)


def _per_tensor(scale) -> bool:
    return not isinstance(scale, torch.Tensor) or scale.numel() == 1


def _qparams_check(node: Node, dtype: torch.dtype) -> str | None:
    args = full_args(node)
    scale = _const(node, args[1]) if isinstance(args[1], Node) else args[1]
    zp = _const(node, args[2]) if isinstance(args[2], Node) else args[2]
    if scale is None or zp is None:
        return "scale and zero point must be constants"
    if not (_per_tensor(scale) and _per_tensor(zp)):
        return "per-channel quantize/dequantize is not lowered (per-tensor only)"
    if dtype not in _QUANT_DTYPES:
        return f"{dtype} storage is not lowered (int8/uint8 only)"
    return None


def _quantize_check(node: Node) -> str | None:
    """per-tensor, int8/uint8 output"""
    return _qparams_check(node, full_args(node)[5])


def _dequantize_check(node: Node) -> str | None:
    """per-tensor int8/uint8 input, or an int32 accumulator (zero point 0, scale per tensor or
    per channel)"""
    dtype = node.all_input_nodes[0].meta["val"].dtype
    if dtype != torch.int32:
        return _qparams_check(node, dtype)
    args = full_args(node)
    scale, zp = (_const(node, a) if isinstance(a, Node) else a for a in args[1:3])
    if not isinstance(scale, torch.Tensor) or not isinstance(zp, torch.Tensor):
        return "scale and zero point must be constants"
    if bool(zp.any()):
        return "int32 dequantize with a non-zero zero point is not lowered"
    if scale.numel() > 1 and args[3] is None:
        return "per-channel scale without an axis"
    return None


def _weight_zp(node: Node, arg) -> int | None:
    """The single zero point of a constant weight, or None when it varies per channel."""
    if not isinstance(arg, Node):
        return int(arg)
    zp = _const(node, arg)
    if zp is None or zp.numel() == 0 or bool((zp != zp.reshape(-1)[0]).any()):
        return None
    return int(zp.reshape(-1)[0])


def _accumulating_check(node: Node) -> str | None:
    """int8/uint8 operands, constant weight with one zero point"""
    args = full_args(node)
    x, w = args[0], args[2]
    for t in (x.meta["val"], w.meta["val"]):
        if t.dtype not in _QUANT_DTYPES:
            return f"{t.dtype} operands are not lowered (int8/uint8 only)"
    if "matmul" not in str(node.target):
        if _const(node, w) is None:
            return "the weight must be a constant"
        if _weight_zp(node, args[3]) is None:
            return "per-channel weight zero points that differ are not lowered (TOSA takes one)"
    return None


def _matmul_check(node: Node) -> str | None:
    """int8/uint8 operands (activation x activation or constant)"""
    return _accumulating_check(node)


def _linear_check(node: Node) -> str | None:
    """int8/uint8, constant weight with one zero point; not a 1x1 row times a [1, N>1] weight"""
    why = _accumulating_check(node)
    if why is not None:
        return why
    # [1, 1, 1] x [1, 1, N] tosa.matmul: iree-compile (data tiling) fails with "tiling factors
    # must be less than or equal to the input rank for pack or output rank for unpack".
    # Measured (M, K, N): (1,1,2), (1,1,3), (1,1,2)+bias fail; (1,1,1), (2,1,2), (4,1,5),
    # (1,2,2), (1,3,1) compile (tests/test_fuzz.py::test_regression_iree_int8_linear_single_row_k1)
    x_shape, w_shape = dims(node.args[0].meta["val"].shape), node.args[2].meta["val"].shape
    if x_shape[-1] == DYN:
        return "the input feature dim must be static"
    if _prod(x_shape[:-1]) == 1 and w_shape[-1] == 1 and w_shape[0] > 1:   # static shapes only
        return "a single row with one input feature (M = K = 1, N > 1) fails in iree-compile's data tiling"
    return None


def _conv_check(node: Node, spatial: int = 2) -> str | None:
    """int8/uint8, one weight zero point"""
    why = _accumulating_check(node)
    if why is not None:
        return why
    args = full_args(node)
    why = static_dims(node, args[0].meta["val"], tuple(range(1, 2 + spatial)),
                      "channels, height and width of a conv input" if spatial == 2
                      else "channels and length of a conv1d input")
    if why is not None:
        return why
    groups, cin = args[8], args[0].meta["val"].shape[1]
    # depthwise 1x1 with padding: iree-compile fails ("'tosa.pad' op expect input and output to
    # have same element type, got 'i32' and 'i8'"). Measured on [2, 2, 9, 4] int8 inputs:
    # depthwise k1 pad1 (multiplier 1 and 3, dilation 1/2, with/without bias) fail; depthwise
    # k3 pad1 and groups-1 k1 pad1 compile (tests/test_fuzz.py::test_regression_iree_depthwise_1x1_padded)
    kernel, padding = args[2].meta["val"].shape[2:], args[6]
    if groups == cin != 1 and all(k == 1 for k in kernel) and any(p != 0 for p in padding):
        return "depthwise 1x1 conv with padding fails in iree-compile (tosa.pad element type)"
    return None


def _requant_check(node: Node) -> str | None:
    """int8/uint8 output, per-tensor or per-channel; fixed: scale < 1"""
    args = full_args(node)
    acc_scale, out_scale, dtype, profile = _const(node, args[1]), args[2], args[6], args[8]
    if dtype not in _QUANT_DTYPES:
        return f"{dtype} output is not lowered (int8/uint8 only)"
    if acc_scale is None:
        return "the accumulator scale must be a constant"
    if profile == "fixed":
        # IREE's rescale adds the output zero point in int32: |acc * scale| + |zp| must stay
        # below 2^31 for every possible int32 accumulator, which holds for scale < _RESCALE_LIMIT.
        worst = max(numerics.fixed_scale(s, out_scale) for s in acc_scale.reshape(-1).tolist())
        if worst >= _RESCALE_LIMIT:
            return f"requantization scale {worst:.6g} >= 1 could leave int32 inside tosa.rescale"
    return None


def _mean_check(node: Node) -> str | None:
    """int8/uint8, fewer than 2^23 summed elements"""
    args = full_args(node)
    q = args[0].meta["val"]
    if q.dtype not in _QUANT_DTYPES:
        return f"{q.dtype} is not lowered"
    why = static_dims(node, q, [d % q.dim() for d in args[2]], "the dims a mean reduces")
    if why is not None:
        return why
    n = math.prod(q.shape[d % q.dim()] for d in args[2])
    if n >= 2**23:
        return f"mean over {n} elements could overflow the int32 sum"
    return None


def _pool_check(node: Node) -> str | None:
    """dilation 1, floor mode"""
    args = full_args(node)
    if any(d != 1 for d in args[4]) or args[5]:
        return "max_pool2d with dilation or ceil_mode is not lowered"
    return static_dims(node, args[0].meta["val"], (1, 2, 3), "channels, height and width of a pool input")


def _binary_check(node: Node) -> str | None:
    """int8/uint8, same rank or broadcastable"""
    args = full_args(node)
    if args[10] not in _QUANT_DTYPES:
        return f"{args[10]} output is not lowered"
    return None


# ----------------------------------------------------------------- float <-> int helpers
def _f32(em: Emitter, v: Val) -> Val:
    """Real value minus zero point handled by the caller: int stored -> f32 (sitofp)."""
    return Val(em.b.arith.sitofp(em.b.ttype(v.shape, torch.float32), v.value), torch.float32, v.shape)


def _dequantize(em: Emitter, q: Val, scale: float, zp: int) -> Val:
    """x = fp32(int32(q) - zp) * s (numerics.dequantize)."""
    b = em.b
    q32 = b.ext_i32(q)
    centered = b.arith.subi(q32.value, b.splat(q.shape, torch.int32, zp - q.offset, like=q.value))
    f = b.arith.sitofp(b.ttype(q.shape, torch.float32), centered)
    return Val(b.arith.mulf(f, b.splat(q.shape, torch.float32, np.float32(scale), like=q.value)), torch.float32,
               q.shape)


def _round_clamp_to_int(em: Emitter, r, shape, zp: int, qmin: int, qmax: int, dtype) -> Val:
    """clamp(RNE(r), qmin - zp, qmax - zp), NaN -> qmin - zp, then + zp, stored as i8.
    maxnumf returns its non-NaN operand, so NaN becomes the lower bound with no cmpf/select
    (iree-compile rejected that arith.select on dynamic shapes: "condition is signless i1 or
    has matching shape").

    Clamped first, then rounded: equal because rounding is monotone and the bounds are
    integers. After the clamp |r| <= 383 < 2^22, so `(r + 1.5 * 2^23) - 1.5 * 2^23` is RNE(r)
    exactly: the sum lies in [2^23, 2^24), where the fp32 ulp is 1, so the IEEE addition rounds
    r half-to-even (1.5 * 2^23 is even), and the subtraction of two such integers is exact.
    IREE's math.roundeven costs 3x this on an elementwise requantize (AVX-512: 30 vs 11 us for
    65536 elements), ~0.07 ms of the zoo CNN's float-profile call at batch 8."""
    b, off = em.b, offset_of(dtype)
    f32 = torch.float32
    lo, hi = b.splat(shape, f32, qmin - zp, like=r), b.splat(shape, f32, qmax - zp, like=r)
    r = b.arith.minnumf(b.arith.maxnumf(r, lo), hi)
    magic = b.splat(shape, f32, 12582912.0, like=r)   # 1.5 * 2^23
    r = b.arith.subf(b.arith.addf(r, magic), magic)
    q32 = b.arith.addi(b.arith.fptosi(b.ttype(shape, torch.int32), r), b.splat(shape, torch.int32, zp - off, like=r))
    return Val(b.arith.trunci(b.ttype(shape, torch.int8), q32), dtype, shape, off)


def _quantize(em: Emitter, x: Val, scale: float, zp: int, qmin: int, qmax: int, dtype) -> Val:
    """q = clamp(RNE(fp32(x) / fp32(s)) + zp, qmin, qmax), NaN -> qmin (numerics.quantize)."""
    b = em.b
    d = b.arith.divf(x.value, b.splat(x.shape, torch.float32, np.float32(scale), like=x.value))  # IEEE division
    return _round_clamp_to_int(em, d, x.shape, zp, qmin, qmax, dtype)


def _scalar(em: Emitter, arg):
    t = em.constant(arg) if isinstance(arg, Node) else arg
    return t.reshape(-1)[0].item() if isinstance(t, torch.Tensor) else t


# ------------------------------------------------------------------------- quant ops
@tosa_lowering("qlower::quantize", check=_quantize_check, dynamic_dims=True)
def emit_quantize(em: Emitter, node: Node) -> Val:
    x, scale, zp, qmin, qmax, dtype = full_args(node)[:6]
    return _quantize(em, em.value(x), float(_scalar(em, scale)), int(_scalar(em, zp)), qmin, qmax, dtype)


@tosa_lowering("qlower::dequantize", check=_dequantize_check, dynamic_dims=True)
def emit_dequantize(em: Emitter, node: Node) -> Val:
    q, scale, zp, axis = full_args(node)[:4]
    if q.meta["val"].dtype == torch.int32:
        return _dequantize_accumulator(em, em.value(q), em.constant(scale).to(torch.float32).reshape(-1), axis)
    return _dequantize(em, em.value(q), float(_scalar(em, scale)), int(_scalar(em, zp)))


def _dequantize_accumulator(em: Emitter, acc: Val, scale: torch.Tensor, axis) -> Val:
    """x = fp32(acc) * s, s per tensor or per channel along `axis` (numerics.dequantize with zero
    point 0): sitofp, then one IEEE multiply broadcast along the last dim (the channel moved
    there and back, as for requantize). The int32 accumulator of a conv/linear whose output
    feeds float ops (QuantConfig(requantize_outputs=False), the transformer presets)."""
    b = em.b
    moved, inverse = _move_axis_last(em, acc, axis if scale.numel() > 1 else None)
    f = _f32(em, moved)
    s = scale.numpy().astype(np.float32)
    s_const = b.const(s.reshape([1] * (len(moved.shape) - 1) + [s.size]))
    y = Val(b.tosa.mul(b.ttype(moved.shape, torch.float32), f.value, s_const, b.const(np.zeros([1], dtype=np.int8))),
            torch.float32, moved.shape)
    return y if inverse is None else em.b.transpose(y, inverse)


def _binary(em: Emitter, node: Node, op: str) -> Val:
    """y = Q(DQ(a) op DQ(b)) in fp32, broadcasting like PyTorch (ops/integer.py _binary)."""
    a, sa, za, b_, sb, zb, sy, zy, qmin, qmax, dtype = full_args(node)
    shape = dims(node.meta["val"].shape)
    va, vb = em.value(a), em.value(b_)
    same = _same_symbolic_shape(a, b_, node)
    if (va.transposed_from is not None and vb.transposed_from is not None and va.shape == vb.shape == shape
            and va.transposed_from[1] == vb.transposed_from[1]):
        # both operands are transposes by the same perm (NHWC results seen as NCHW): the
        # elementwise op runs on the sources and its result is transposed once
        perm = va.transposed_from[1]
        y = _binary_values(em, va.transposed_from[0], vb.transposed_from[0], (sa, za), (sb, zb), sy, zy, qmin, qmax,
                           dtype, op, va.transposed_from[0].shape, same)
        return em.b.transpose(y, perm)
    return _binary_values(em, va, vb, (sa, za), (sb, zb), sy, zy, qmin, qmax, dtype, op, shape, same)


def _same_symbolic_shape(*nodes: Node) -> bool:
    """Every node's value has the same shape, dim by dim the same integer or symbol."""
    shapes = [[str(d) for d in n.meta["val"].shape] for n in nodes]
    return all(s == shapes[0] for s in shapes)


def _binary_values(em: Emitter, va: Val, vb: Val, qa, qb, sy, zy, qmin, qmax, dtype, op: str, shape,
                   same_shape: bool = False) -> Val:
    """`same_shape` (both operands and the result, symbolically): the op is elementwise arith on
    tensors, not tosa.add/mul. TOSA broadcasts, so with two dynamic dims IREE lowers tosa.add to
    a runtime choice per dim (`scf.if dim == 1`, broadcast or not), and on an int8 program with
    batch and sequence dynamic (a quantized residual add after a LayerNorm, found by fuzzing)
    those branches made iree-compile fail: "failed to schedule execution partitions without
    cyclic dependencies". Same IEEE fp32 operation either way."""
    fa, fb = (_broadcast_rank(em, _dequantize(em, v, s, z), len(shape)) for v, (s, z) in ((va, qa), (vb, qb)))
    t = em.b.ttype(shape, torch.float32)
    if same_shape and fa.shape == fb.shape == list(shape):
        y = (em.b.arith.addf if op == "add" else em.b.arith.mulf)(fa.value, fb.value)
    elif op == "add":
        y = em.b.tosa.add(t, fa.value, fb.value)
    else:
        y = em.b.tosa.mul(t, fa.value, fb.value, em.b.const(np.zeros([1], dtype=np.int8)))
    y = Val(y, torch.float32, shape)
    d = em.b.arith.divf(y.value, em.b.splat(shape, torch.float32, np.float32(sy), like=y.value))
    return _round_clamp_to_int(em, d, shape, zy, qmin, qmax, dtype)


def _broadcast_rank(em: Emitter, v: Val, rank: int) -> Val:
    return v if len(v.shape) == rank else em.b.reshape(v, [1] * (rank - len(v.shape)) + v.shape)


@tosa_lowering("qlower::add", check=_binary_check, dynamic_dims=True)
def emit_add(em: Emitter, node: Node) -> Val:
    return _binary(em, node, "add")


@tosa_lowering("qlower::mul", check=_binary_check, dynamic_dims=True)
def emit_mul(em: Emitter, node: Node) -> Val:
    return _binary(em, node, "mul")


# -------------------------------------------------------------------------- requantize
def _move_axis_last(em: Emitter, v: Val, axis: int | None) -> tuple[Val, list[int] | None]:
    """TOSA's per-channel rescale scales the innermost dimension: transpose `axis` there."""
    if axis is None or axis % len(v.shape) == len(v.shape) - 1:
        return v, None
    a = axis % len(v.shape)
    perm = [d for d in range(len(v.shape)) if d != a] + [a]
    inverse = [perm.index(d) for d in range(len(perm))]
    return em.b.transpose(v, perm), inverse


def _clamp_stored(em: Emitter, v: Val, qmin: int, qmax: int) -> Val:
    """tosa.clamp to [qmin, qmax] (in stored units) when narrower than the storage range."""
    lo_nat, hi_nat = numerics.dtype_range(v.dtype)
    if (qmin, qmax) == (lo_nat, hi_nat):
        return v
    i8 = em.b.elem(torch.int8)
    ir = em.b.ir
    out = em.b.tosa.clamp(em.b.ttype(v.shape, torch.int8), v.value, ir.IntegerAttr.get(i8, qmin - v.offset),
                          ir.IntegerAttr.get(i8, qmax - v.offset))
    return Val(out, v.dtype, v.shape, v.offset)


def _rescale_fixed(em: Emitter, acc: Val, scales: list[float], out_scale: float, zy: int, dtype) -> Val:
    """tosa.rescale: scale32, SINGLE_ROUND, per-channel multiplier/shift from numerics."""
    b, ir = em.b, em.b.ir
    mults = [numerics.fixed_multiplier(numerics.fixed_scale(s, out_scale)) for s in scales]
    off = offset_of(dtype)
    out = b.tosa.rescale(
        b.ttype(acc.shape, torch.int8), acc.value,
        b.const(np.array([m.multiplier for m in mults], dtype=np.int32)),
        b.const(np.array([m.shift for m in mults], dtype=np.int8)),
        b.zp(0, torch.int32), b.zp(zy - off, torch.int8),
        True, ir.Attribute.parse("#tosa<rounding_mode<SINGLE_ROUND>>"), len(mults) > 1, False, False)
    return Val(out, dtype, acc.shape, off)


def _rescale_float(em: Emitter, acc: Val, multipliers: torch.Tensor, zy: int, qmin: int, qmax: int, dtype) -> Val:
    """y = clamp(RNE(fp32(acc) * M) + zy): sitofp, mulf (broadcast along the last dim), RNE."""
    b = em.b
    f = _f32(em, acc)
    m = multipliers.reshape(-1).to(torch.float32).numpy()
    m_const = b.const(m.reshape([1] * (len(acc.shape) - 1) + [m.size]))
    y = b.tosa.mul(b.ttype(acc.shape, torch.float32), f.value, m_const, b.const(np.zeros([1], dtype=np.int8)))
    return _round_clamp_to_int(em, y, acc.shape, zy, qmin, qmax, dtype)


@tosa_lowering("qlower::requantize", check=_requant_check, dynamic_dims=True)
def emit_requantize(em: Emitter, node: Node) -> Val:
    acc_n, acc_scale_n, out_scale, zy, qmin, qmax, dtype, axis, profile = full_args(node)
    acc_scale = em.constant(acc_scale_n).to(torch.float32).reshape(-1)
    acc, inverse = _move_axis_last(em, em.value(acc_n), axis if acc_scale.numel() > 1 else None)
    if profile == "fixed":
        y = _clamp_stored(em, _rescale_fixed(em, acc, acc_scale.tolist(), out_scale, zy, dtype), qmin, qmax)
    else:
        y = _rescale_float(em, acc, numerics.float_multiplier(acc_scale, out_scale), zy, qmin, qmax, dtype)
    return y if inverse is None else em.b.transpose(y, inverse)


# -------------------------------------------------------------------- accumulating ops
def _weight(em: Emitter, node: Node, w_arg, zp_arg) -> tuple[np.ndarray, int]:
    """The constant weight in stored units (int8) and its stored zero point."""
    w = em.constant(w_arg)
    off = offset_of(w.dtype)
    zp = _weight_zp(node, zp_arg) - off
    return (w.to(torch.int32) - off).to(torch.int8).numpy(), zp


def _bias(em: Emitter, bias_arg, channels: int) -> np.ndarray:
    bias = em.constant(bias_arg) if isinstance(bias_arg, Node) else None
    return np.zeros([channels], np.int32) if bias is None else bias.to(torch.int32).reshape(-1).numpy()


def _window(em: Emitter, x: Val, kernel, stride, padding, dilation) -> tuple[Val, object]:
    """NHWC input and TOSA pads [top, bottom, left, right] for a sliding window. TOSA requires
    (in - 1 + pads - (k - 1) * d) to be divisible by the stride; the remainder is rows/columns
    no window reads, so it comes off the bottom/right padding, or off the input itself."""
    crop, pads = list(x.shape), []
    for axis, (k, s, p, d) in enumerate(zip(kernel, stride, padding, dilation)):
        size = x.shape[1 + axis]
        extra = (size - 1 + 2 * p - (k - 1) * d) % s
        bottom = p - extra
        if bottom < 0:
            crop[1 + axis] += bottom
            bottom = 0
        pads += [p, bottom]
    return em.b.crop(x, crop), em.b.ir.DenseI64ArrayAttr.get(pads)


@tosa_lowering("qlower::conv2d", check=_conv_check)
def emit_conv2d(em: Emitter, node: Node) -> Val:
    """NCHW -> NHWC, a groups-1 conv as qlower's im2col + i8 matmul (_conv_im2col; with
    IreeOptions(conv_im2col=False) tosa.conv2d), tosa.depthwise_conv2d (i32 acc), or one of
    those per group; NHWC -> NCHW; IREE cancels the transposes between consecutive convs."""
    x_n, x_zp, w_n, w_zp, bias_n, stride, padding, dilation, groups = full_args(node)
    w, wzp = _weight(em, node, w_n, w_zp)
    return _conv(em, em.value(x_n), x_zp, w, wzp, _bias(em, bias_n, w.shape[0]), list(stride), list(padding),
                 list(dilation), groups, dims(node.meta["val"].shape))


def _conv1d_check(node: Node) -> str | None:
    """int8/uint8, one weight zero point, static channels and length"""
    return _conv_check(node, spatial=1)


@tosa_lowering("qlower::conv1d", check=_conv1d_check)
def emit_conv1d(em: Emitter, node: Node) -> Val:
    """The 2-D conv of height 1: [N, C, L] viewed as [N, C, 1, L], the weight as [O, I, 1, K]
    (a reshape: the same sums, so the same int32 accumulator)."""
    x_n, x_zp, w_n, w_zp, bias_n, stride, padding, dilation, groups = full_args(node)
    w, wzp = _weight(em, node, w_n, w_zp)
    x = em.value(x_n)
    n, cout, length = dims(node.meta["val"].shape)
    acc = _conv(em, em.b.reshape(x, [x.shape[0], x.shape[1], 1, x.shape[2]]), x_zp, w[:, :, None, :], wzp,
                _bias(em, bias_n, w.shape[0]), [1, stride[0]], [0, padding[0]], [1, dilation[0]], groups,
                [n, cout, 1, length])
    return em.b.reshape(acc, [n, cout, length])


def _conv(em: Emitter, x_nchw: Val, x_zp: int, w: np.ndarray, wzp: int, bias: np.ndarray, stride, padding,
          dilation, groups: int, out_nchw: list[int]) -> Val:
    """The int32 accumulator [N, Cout, OH, OW] of a conv of stored values (weight OIHW int8).
    Grouped (neither 1 nor depthwise): one conv per group on its channel slice, concatenated —
    the same sums, group by group."""
    b, ir = em.b, em.b.ir
    cin = x_nchw.shape[1]
    if groups not in (1, cin):
        cin_g, cout_g = cin // groups, w.shape[0] // groups
        parts = []
        for g in range(groups):
            start, size = [0, g * cin_g, 0, 0], [x_nchw.shape[0], cin_g, *x_nchw.shape[2:]]
            xg = Val(b.tosa.slice(b.ttype(size, x_nchw.dtype), x_nchw.value, b.shape_value(start), b.shape_value(size)),
                     x_nchw.dtype, size, x_nchw.offset)
            cut = slice(g * cout_g, (g + 1) * cout_g)
            parts.append(_conv(em, xg, x_zp, w[cut], wzp, bias[cut], stride, padding, dilation, 1,
                               [out_nchw[0], cout_g, *out_nchw[2:]]))
        out = b.tosa.concat([p.value for p in parts], 1, results=[b.ttype(out_nchw, torch.int32)])
        return Val(out, torch.int32, list(out_nchw))
    if groups == 1 and em.options.conv_im2col:
        x = b.transpose(x_nchw, [0, 2, 3, 1])
        acc = _conv_im2col(em, x, x_zp - x.offset, w, wzp, bias, stride, padding, dilation, out_nchw)
        return b.transpose(acc, [0, 3, 1, 2])
    x, pads = _window(em, b.transpose(x_nchw, [0, 2, 3, 1]), w.shape[2:], stride, padding, dilation)
    n, cout, oh, ow = out_nchw
    out_t = b.ttype([n, oh, ow, cout], torch.int32)
    common = (b.const(bias), b.zp(x_zp - x.offset, torch.int8), b.zp(wzp, torch.int8),
              pads, ir.DenseI64ArrayAttr.get(list(stride)), ir.DenseI64ArrayAttr.get(list(dilation)),
              ir.TypeAttr.get(b.elem(torch.int32)))
    if groups == 1:
        acc = b.tosa.conv2d(out_t, x.value, b.const(w.transpose(0, 2, 3, 1)), *common)   # OIHW -> OHWI
    else:   # depthwise: weight [C*M, 1, KH, KW] -> [KH, KW, C, M]
        cin = x.shape[3]
        kh, kw = w.shape[2], w.shape[3]
        dw = w.reshape(cin, cout // cin, kh, kw).transpose(2, 3, 0, 1)
        acc = b.tosa.depthwise_conv2d(out_t, x.value, b.const(dw), *common)
    return b.transpose(Val(acc, torch.int32, [n, oh, ow, cout]), [0, 3, 1, 2])


def _shape_text(shape) -> str:
    return "x".join("?" if d == DYN else str(d) for d in shape)


def _conv_im2col(em: Emitter, x: Val, xzp: int, w: np.ndarray, wzp: int, bias: np.ndarray, stride, padding,
                 dilation, out_nchw) -> Val:
    """A groups-1 int8 conv as its own im2col, in linalg (a private function `main` calls):
    x (NHWC, stored i8) padded with its stored zero point (`tensor.pad`), strided
    `tensor.extract_slice`s concatenated along channels (column taps, then row taps),
    collapsed to [N*OH*OW, KH*KW*C], one i8 x i8 -> i32 `linalg.matmul` with the
    [KH*KW*C, Cout] weight whose accumulator starts at the bias (IREE data-tiles it).

    Zero points: sum((x - zx)(w - zw)) = sum(x w) - zx sum(w) - zw sum(x) + K zx zw over a
    window of the padded input (every padded element is zx, so each window has K terms).
    With zw = 0 (symmetric weights) the zx term is a constant per output channel, folded into
    the bias (int32 arithmetic wraps, so every intermediate may overflow as long as the
    accumulator fits, which the lowering pass proved); otherwise `linalg.quantized_matmul`
    takes both zero points. A 1x1 kernel with stride 1 needs no slices.

    Why not tosa.conv2d: IREE 3.13's own im2col rewrite fails on it, and the direct conv runs
    at a fraction of the int8 matmul path's speed (docs/iree.md)."""
    b = em.b
    cout, cin, kh, kw = w.shape
    n, h, wd, c = x.shape
    _, _, oh, ow = out_nchw
    k = kh * kw * cin
    wmat = np.ascontiguousarray(w.transpose(2, 3, 1, 0)).reshape(k, cout)   # OIHW -> [KH*KW*C, O]
    if wzp == 0:
        # bias - zx * colsum(w), wrapped to int32 like the device arithmetic
        folded = bias.astype(np.int64) - xzp * wmat.astype(np.int64).sum(axis=0)
        bias = ((folded + 2**31) % 2**32 - 2**31).astype(np.int32)
    need = [(o - 1) * s + (kk - 1) * d + 1 for o, s, kk, d in zip((oh, ow), stride, (kh, kw), dilation)]
    low = list(padding)
    high = [max(0, nd - size - p) for nd, size, p in zip(need, (h, wd), low)]
    padded = [size + lo + hi for size, lo, hi in zip((h, wd), low, high)]
    name = f"conv_im2col_{em.private_functions}"
    xt, m = _shape_text(x.shape), DYN if n == DYN else n * oh * ow
    lines = [f"func.func private @{name}(%x: tensor<{xt}xi8>, %w: tensor<{k}x{cout}xi8>, "
             f"%bias: tensor<{cout}xi32>) -> tensor<{_shape_text([n, oh, ow, cout])}xi32> {{"]
    dyn_n, dyn_m = "", ""
    if n == DYN:
        lines += ["  %c0 = arith.constant 0 : index", "  %n = tensor.dim %x, %c0 : tensor<" + xt + "xi8>",
                  f"  %ohw = arith.constant {oh * ow} : index", "  %m = arith.muli %n, %ohw : index"]
        dyn_n, dyn_m = "%n", "%m"
    src, src_t = "%x", xt
    if any(low) or any(high):
        src_t = _shape_text([n, *padded, c])
        lines += [f"  %pv = arith.constant {xzp} : i8",
                  f"  %xp = tensor.pad %x low[0, {low[0]}, {low[1]}, 0] high[0, {high[0]}, {high[1]}, 0] {{",
                  "  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):", "    tensor.yield %pv : i8",
                  f"  }} : tensor<{xt}xi8> to tensor<{src_t}xi8>"]
        src = "%xp"
    if (kh, kw) != (1, 1) or list(stride) != [1, 1]:
        (sh, sw), (dh, dw) = stride, dilation
        # two passes of strided slices, each concatenated along channels: the KW column taps
        # ([N, Hp, OW, KW*C]), then the KH row taps of that ([N, OH, OW, KH*KW*C], order kh, kw, c).
        # IREE makes each slice a copy dispatch; KW + KH of them instead of KH * KW saved 2-3% on
        # the zoo CNN (0.715 -> 0.698 ms, batch 8). A single gathering linalg.generic (fused with
        # the matmul operand packing) was slower: IREE does not vectorize its (oh * s + kh) reads
        # (1.28 ms); so was a generic selecting among the KH * KW slices by tap index.
        size_n = "%n" if n == DYN else str(n)
        hp = padded[0]
        b1_t = _shape_text([n, hp, ow, kw * c])
        sl_t = _shape_text([n, hp, ow, c])
        names = [f"%w{j}" for j in range(kw)]
        for j, nm in enumerate(names):
            lines.append(f"  {nm} = tensor.extract_slice {src}[0, 0, {j * dw}, 0] [{size_n}, {hp}, {ow}, {c}] "
                         f"[1, 1, {sw}, 1] : tensor<{src_t}xi8> to tensor<{sl_t}xi8>")
        lines.append("  %b1 = tensor.concat dim(3) " + ", ".join(names) + " : ("
                     + ", ".join([f"tensor<{sl_t}xi8>"] * kw) + f") -> tensor<{b1_t}xi8>")
        sl2_t = _shape_text([n, oh, ow, kw * c])
        names = [f"%h{i}" for i in range(kh)]
        for i, nm in enumerate(names):
            lines.append(f"  {nm} = tensor.extract_slice %b1[0, {i * dh}, 0, 0] [{size_n}, {oh}, {ow}, {kw * c}] "
                         f"[1, {sh}, 1, 1] : tensor<{b1_t}xi8> to tensor<{sl2_t}xi8>")
        cat_t = _shape_text([n, oh, ow, k])
        lines += ["  %cat = tensor.concat dim(3) " + ", ".join(names) + " : ("
                  + ", ".join([f"tensor<{sl2_t}xi8>"] * kh) + f") -> tensor<{cat_t}xi8>",
                  f"  %a2 = tensor.collapse_shape %cat [[0, 1, 2], [3]] : tensor<{cat_t}xi8> into "
                  f"tensor<{_shape_text([m, k])}xi8>"]
    else:
        lines += [f"  %a2 = tensor.collapse_shape {src} [[0, 1, 2], [3]] : tensor<{src_t}xi8> into "
                  f"tensor<{_shape_text([m, k])}xi8>"]
    mt = _shape_text([m, cout])
    lines += [f"  %e = tensor.empty({dyn_m}) : tensor<{mt}xi32>",
              f"  %init = linalg.broadcast ins(%bias : tensor<{cout}xi32>) outs(%e : tensor<{mt}xi32>) "
              "dimensions = [0]"]
    if wzp == 0:
        lines.append(f"  %r = linalg.matmul ins(%a2, %w : tensor<{_shape_text([m, k])}xi8>, tensor<{k}x{cout}xi8>) "
                     f"outs(%init : tensor<{mt}xi32>) -> tensor<{mt}xi32>")
    else:
        lines += [f"  %zx = arith.constant {xzp} : i32", f"  %zw = arith.constant {wzp} : i32",
                  f"  %r = linalg.quantized_matmul ins(%a2, %w, %zx, %zw : tensor<{_shape_text([m, k])}xi8>, "
                  f"tensor<{k}x{cout}xi8>, i32, i32) outs(%init : tensor<{mt}xi32>) -> tensor<{mt}xi32>"]
    out_t = _shape_text([n, oh, ow, cout])
    lines += [f"  %y = tensor.expand_shape %r [[0, 1, 2], [3]] output_shape [{dyn_n or n}, {oh}, {ow}, {cout}] : "
              f"tensor<{mt}xi32> into tensor<{out_t}xi32>", f"  return %y : tensor<{out_t}xi32>", "}"]
    result_t = b.ttype([n, oh, ow, cout], torch.int32)
    (out,) = em.call_text_function("\n".join(lines), name, [x.value, b.const(wmat), b.const(bias)], [result_t])
    return Val(out, torch.int32, [n, oh, ow, cout])


def _matmul3(em: Emitter, a: Val, bmat: Val, a_zp: int, b_zp: int) -> Val:
    """tosa.matmul of [B, M, K] x [B, K, N] -> [B, M, N] i32 with zero points as operands."""
    b = em.b
    shape = [a.shape[0], a.shape[1], bmat.shape[2]]
    out = b.tosa.matmul(b.ttype(shape, torch.int32), a.value, bmat.value,
                        b.zp(a_zp - a.offset, torch.int8), b.zp(b_zp - bmat.offset, torch.int8))
    return Val(out, torch.int32, shape)


@tosa_lowering("qlower::linear", check=_linear_check, dynamic_dims=True)
def emit_linear(em: Emitter, node: Node) -> Val:
    """x[..., K] @ w[N, K]^T + bias as one [1, M, K] x [1, K, N] tosa.matmul."""
    x_n, x_zp, w_n, w_zp, bias_n = full_args(node)
    b = em.b
    x = em.value(x_n)
    w, wzp = _weight(em, node, w_n, w_zp)
    k, n_out = w.shape[1], w.shape[0]
    rows = _prod(x.shape[:-1])
    wt = Val(b.const(np.ascontiguousarray(w.T).reshape(1, k, n_out)), torch.int8, [1, k, n_out])
    acc = _matmul3(em, b.reshape(x, [1, rows, k]), wt, x_zp, wzp)
    bias = b.const(_bias(em, bias_n, n_out).reshape(1, 1, n_out))
    acc = Val(b.tosa.add(b.ttype(acc.shape, torch.int32), acc.value, bias), torch.int32, acc.shape)
    return _to_output_shape(em, acc, node)


def _weight_only_check(node: Node) -> str | None:
    """float32 input, static feature dim, constant codes/scales/zero points/bias, 4 or 8 bits"""
    x, codes, scale, zp, bias, bits, _ = full_args(node)
    if x.meta["val"].dtype != torch.float32:
        return f"{x.meta['val'].dtype} input is not lowered (float32 only)"
    if dims(x.meta["val"].shape)[-1] == DYN:
        return "the input feature dim must be static"
    if any(a is not None and _const(node, a) is None for a in (codes, scale, zp, bias)):
        return "weight-only codes, scales, zero points and bias must be constants"
    if bits not in (4, 8):
        return f"{bits}-bit codes are not lowered (4 or 8)"
    return None


# IREE inlines constants of up to 256 bytes into the dispatches that read them
# (--iree-flow-inline-constants-max-byte-length), where an i4 one fails to legalize ("failed to
# legalize operation 'memref.get_global'", measured on a [80, 3] zero point): those stay 8-bit
_INLINED_BYTES = 256


def _dense(b, array: np.ndarray, bits: int):
    """(arith.constant of unsigned codes as i`bits`, its element type name): i4 is stored 4-bit
    in the module; a constant IREE would inline as i8."""
    ir = b.ir
    if bits == 4 and array.size * bits // 8 <= _INLINED_BYTES:
        bits = 8
    element = ir.IntegerType.get_signless(bits)
    attr = ir.DenseElementsAttr.get(np.ascontiguousarray(array.astype(np.uint8).view(np.int8)), type=element)
    return b.arith.constant(ir.RankedTensorType.get(list(array.shape), element), attr), f"i{bits}"


@tosa_lowering("qlower::linear_weight_only", check=_weight_only_check, dynamic_dims=True)
def emit_linear_weight_only(em: Emitter, node: Node) -> Val:
    """y = x[..., K] @ w^T (+ bias), w dequantized in the module: codes i4/i8 [N, G, g], zero
    points i4/i8 and scales f32 [N, G] are the module's constants; one `linalg.generic` computes
    w = fp32(int32(u) - zp) * s (numerics.dequantize_weight_groups: an exact integer, one
    rounding), a `linalg.matmul` with the transposed weight sums the products in IREE's order
    (the reordered-sum profile, docs/llm.md), and the bias is added last. A shorter last group
    (g not dividing K: SmolLM2's K = 576 in groups of 128) has its codes padded with the zero
    point's and the dequantized weight sliced back to K. Where the dequantized weight lives is
    IREE's const-expr hoisting (IreeOptions.weight_only_dequantize)."""
    x_n, codes_n, scale_n, zp_n, bias_n, bits, group = full_args(node)
    b = em.b
    scale = em.constant(scale_n).detach().to(torch.float32).numpy()
    zp = em.constant(zp_n).detach().numpy()
    n, k = codes_n.meta["val"].shape
    g, groups = min(group, k), scale.shape[1]        # groups = ceil(K / g)
    codes = numerics.pad_codes(em.constant(codes_n).detach().numpy(), zp, groups * g)   # past K: weights of 0
    x = em.value(x_n)
    rows = _prod(x.shape[:-1])
    x2 = b.reshape(x, [rows, k])
    m = "?" if rows == DYN else str(rows)
    name = f"weight_only_{em.private_functions}"
    c_const, it = _dense(b, codes.reshape(n, groups, g), bits)
    z_const, zt_elem = _dense(b, zp.reshape(n, groups), bits)
    xt, yt = f"tensor<{m}x{k}xf32>", f"tensor<{m}x{n}xf32>"
    ct, st, zt, wt = (f"tensor<{n}x{groups}x{g}x{it}>", f"tensor<{n}x{groups}xf32>", f"tensor<{n}x{groups}x{zt_elem}>",
                      f"tensor<{n}x{groups}x{g}xf32>")
    grouped, per_group = "affine_map<(n, G, j) -> (n, G, j)>", "affine_map<(n, G, j) -> (n, G)>"
    lines = [f"func.func private @{name}(%x: {xt}, %c: {ct}, %s: {st}, %z: {zt}"
             + (f", %bias: tensor<{n}xf32>" if bias_n is not None else "") + f") -> {yt} {{",
             f"  %e = tensor.empty() : {wt}",
             f"  %w3 = linalg.generic {{indexing_maps = [{grouped}, {per_group}, {per_group}, {grouped}], "
             'iterator_types = ["parallel", "parallel", "parallel"]} '
             f"ins(%c, %s, %z : {ct}, {st}, {zt}) outs(%e : {wt}) {{",
             f"  ^bb0(%u: {it}, %sc: f32, %zp: {zt_elem}, %o: f32):",
             f"    %u32 = arith.extui %u : {it} to i32", f"    %z32 = arith.extui %zp : {zt_elem} to i32",
             "    %d = arith.subi %u32, %z32 : i32", "    %f = arith.sitofp %d : i32 to f32",
             "    %v = arith.mulf %f, %sc : f32", "    linalg.yield %v : f32", f"  }} -> {wt}"]
    padded = f"tensor<{n}x{groups * g}xf32>"
    if groups * g == k:
        lines.append(f"  %w = tensor.collapse_shape %w3 [[0], [1, 2]] : {wt} into {padded}")
    else:
        lines += [f"  %wg = tensor.collapse_shape %w3 [[0], [1, 2]] : {wt} into {padded}",
                  f"  %w = tensor.extract_slice %wg[0, 0] [{n}, {k}] [1, 1] : {padded} to tensor<{n}x{k}xf32>"]
    sizes = ""
    if rows == DYN:
        lines += ["  %c0 = arith.constant 0 : index", f"  %m = tensor.dim %x, %c0 : {xt}"]
        sizes = "%m"
    lines += ["  %zero = arith.constant 0.0 : f32", f"  %ye = tensor.empty({sizes}) : {yt}",
              f"  %y0 = linalg.fill ins(%zero : f32) outs(%ye : {yt}) -> {yt}",
              "  %y = linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (m, k)>, "
              "affine_map<(m, n, k) -> (n, k)>, affine_map<(m, n, k) -> (m, n)>] "
              f"ins(%x, %w : {xt}, tensor<{n}x{k}xf32>) outs(%y0 : {yt}) -> {yt}"]
    result = "%y"
    if bias_n is not None:
        lines += ["  %yb = linalg.generic {indexing_maps = [affine_map<(m, n) -> (m, n)>, affine_map<(m, n) -> (n)>, "
                  'affine_map<(m, n) -> (m, n)>], iterator_types = ["parallel", "parallel"]} '
                  f"ins(%y, %bias : {yt}, tensor<{n}xf32>) outs(%ye : {yt}) {{",
                  "  ^bb0(%a: f32, %bb: f32, %o: f32):", "    %r = arith.addf %a, %bb : f32",
                  "    linalg.yield %r : f32", f"  }} -> {yt}"]
        result = "%yb"
    lines += [f"  return {result} : {yt}", "}"]
    args = [x2.value, c_const, b.const(scale.reshape(n, groups)), z_const]
    if bias_n is not None:
        args.append(b.const(em.constant(bias_n).detach().to(torch.float32).contiguous().numpy()))
    (out,) = em.call_text_function("\n".join(lines), name, args, [b.ttype([rows, n], torch.float32)])
    return _to_output_shape(em, Val(out, torch.float32, [rows, n]), node)


@tosa_lowering("qlower::matmul", check=_matmul_check, dynamic_dims=True)
def emit_matmul(em: Emitter, node: Node) -> Val:
    """a[..., M, K] @ b[..., K, N]: batch dims flattened into TOSA's one batch dimension (a 2-D
    b is shared by every row of a)."""
    a_n, a_zp, b_n, b_zp = full_args(node)
    bld = em.b
    a, bm = em.value(a_n), em.value(b_n)
    m, k, n = a.shape[-2], a.shape[-1], bm.shape[-1]
    if len(bm.shape) == 2:
        acc = _matmul3(em, bld.reshape(a, [1, _prod(a.shape[:-1]), k]), bld.reshape(bm, [1, k, n]), a_zp, b_zp)
    else:
        batch_a, batch_b = (a_n.meta["val"].shape[:-2], b_n.meta["val"].shape[:-2])
        if [str(d) for d in batch_a] != [str(d) for d in batch_b]:   # symbolic dims compared as expressions
            raise NotImplementedError("matmul with broadcast batch dimensions is not lowered")
        batch = _prod(a.shape[:-2])
        sym_a, sym_b = a_n.meta["val"].shape, b_n.meta["val"].shape
        batch_sym = math.prod(sym_a[:-2])
        acc = _matmul3(em, bld.reshape(a, [batch, m, k], [batch_sym, *sym_a[-2:]]),
                       bld.reshape(bm, [batch, k, n], [batch_sym, *sym_b[-2:]]), a_zp, b_zp)
    return _to_output_shape(em, acc, node)


def _to_output_shape(em: Emitter, v: Val, node: Node, sym_in=None) -> Val:
    """v (symbolic shape `sym_in` where known) reshaped to the node's output shape (sizes
    computed at run time where several dims are dynamic)."""
    shape = node.meta["val"].shape
    return em.b.reshape(v, dims(shape), list(shape), sym_in)


def _input_shape(node: Node) -> list:
    return list(node.all_input_nodes[0].meta["val"].shape)


def _prod(shape) -> int:
    """The number of elements of `shape`; DYN when a dim is dynamic."""
    return DYN if DYN in shape else math.prod(shape)


# --------------------------------------------------------------- integer pass-through ops
@tosa_lowering("qlower::max_pool2d", check=_pool_check)
def emit_max_pool2d(em: Emitter, node: Node) -> Val:
    """tosa.max_pool2d on NHWC; exact on stored values (the offset is order-preserving)."""
    q_n, kernel, stride, padding = full_args(node)[:4]
    b, ir = em.b, em.b.ir
    stride = list(stride) or list(kernel)
    x, pads = _window(em, b.transpose(em.value(q_n), [0, 2, 3, 1]), kernel, stride, padding, [1, 1])
    n, c, oh, ow = dims(node.meta["val"].shape)
    out = b.tosa.max_pool2d(b.ttype([n, oh, ow, c], torch.int8), x.value, ir.DenseI64ArrayAttr.get(list(kernel)),
                            ir.DenseI64ArrayAttr.get(stride), pads)
    return b.transpose(Val(out, x.dtype, [n, oh, ow, c], x.offset), [0, 3, 1, 2])


# IREE 3.13 sums a linalg.fill wrongly: tosa.reduce_sum of a fill of 5 over 6 elements gives 5,
# and a tosa.matmul whose operand is a fill gets a wrong zero-point correction (its row sum is
# the fill value). A static splat is an arith.constant, which IREE folds right (measured); a
# splat of a dynamic shape can only be a fill, so an op that makes one runs in PyTorch.
_FILL_REFUSAL = ("one value everywhere on a dynamic shape: IREE 3.13 sums such a tensor (a linalg.fill) "
                 "wrongly, so it runs in PyTorch")


def _table_check(node: Node) -> str | None:
    """int8/uint8 codes, a constant table of int8/uint8 or fp32 entries; on a dynamic shape, an
    8-bit table not all one value (_FILL_REFUSAL)"""
    q_n, table_n = full_args(node)[:2]
    table = _const(node, table_n)
    if q_n.meta["val"].dtype not in _QUANT_DTYPES:
        return "lookup of non-8-bit codes is not lowered"
    if table is None or table.dtype not in (*_QUANT_DTYPES, torch.float32):
        return "the table must be an int8/uint8 or fp32 constant"
    if table.dtype != torch.float32 and bool((table == table.flatten()[0]).all()) \
            and DYN in dims(q_n.meta["val"].shape):
        return f"a table of {_FILL_REFUSAL}"
    return None


@tosa_lowering("qlower::table", check=_table_check, dynamic_dims=True)
def emit_table(em: Emitter, node: Node) -> Val:
    """tosa.table (i8 -> i8, entry `stored + 128`): the stored code plus 128 is q - dtype_min for
    uint8 (stored q - 128) and int8 (stored q) alike, so the table's entries go in as they are,
    each stored with the output's offset. A table of one value everywhere (x * 0, a clamp to one
    code) is that value's constant splat: IREE 3.13 turns a tosa.table whose entries are all equal
    into a linalg.fill, which it sums wrongly (_FILL_REFUSAL; a matmul after it was 20 quanta off
    everywhere), found by the IREE fuzz run. An fp32 table is read as four
    byte tables of its bit patterns (_float_lookup)."""
    q_n, table_n = full_args(node)[:2]
    q, table = em.value(q_n), em.constant(table_n)
    if table.dtype == torch.float32:
        return _float_lookup(em.b, q, table)
    out_offset = offset_of(table.dtype)
    entries = (table.to(torch.int32) - out_offset).to(torch.int8).contiguous().numpy()
    if (entries == entries[0]).all():
        return Val(em.b.splat(q.shape, torch.int8, int(entries[0]), like=q.value), table.dtype, q.shape, out_offset)
    out = em.b.tosa.table(em.b.ttype(q.shape, torch.int8), q.value, em.b.const(entries))
    return Val(out, table.dtype, q.shape, out_offset)


def _float_lookup(b, q: Val, table: torch.Tensor) -> Val:
    """fp32 entries by exact integer data movement: each byte of the entries' bit patterns through
    its own tosa.table (a byte the same in every entry — the sign and high exponent bits, often —
    is a splat: no all-equal tosa.table, _FILL_REFUSAL), or-ed together at its shift in i32, then
    one bitcast."""
    shape, i8, i32 = q.shape, torch.int8, torch.int32
    bits = table.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    word = None
    for shift in (0, 8, 16, 24):
        entries = (((bits >> shift) & 255) - 128).to(torch.int8).contiguous().numpy()
        if (entries == entries[0]).all():
            value = (int(entries[0]) + 128) << shift
            byte = b.splat(shape, i32, value - 2 ** 32 if value >= 2 ** 31 else value, like=q.value)
        else:
            looked_up = b.tosa.table(b.ttype(shape, i8), q.value, b.const(entries))
            byte = b.arith.addi(b.arith.extsi(b.ttype(shape, i32), looked_up), b.splat(shape, i32, 128, like=q.value))
            if shift:
                byte = b.arith.shli(byte, b.splat(shape, i32, shift, like=q.value))
        word = byte if word is None else b.arith.ori(word, byte)
    return Val(b.arith.bitcast(b.ttype(shape, torch.float32), word), torch.float32, shape)


def _layer_norm_check(node: Node) -> str | None:
    """int8/uint8 input, static last dim, fp32 constant weight and bias (or none)"""
    return _integer_norm_check(node, full_args(node)[3:5])


def _integer_norm_check(node: Node, affine: list) -> str | None:
    q_n = full_args(node)[0]
    if q_n.meta["val"].dtype not in _QUANT_DTYPES:
        return "a norm of a non-8-bit value is not lowered here"
    if dims(q_n.meta["val"].shape)[-1] == DYN:
        return "the normalized dim must be static"
    if any(a is not None and _const(node, a) is None for a in affine):
        return "weight and bias must be constants"
    return None


@tosa_lowering("qlower::layer_norm_integer", check=_layer_norm_check, dynamic_dims=True)
def emit_layer_norm_integer(em: Emitter, node: Node) -> Val:
    """numerics.layer_norm_integer in TOSA/arith: i32 tosa.reduce_sum of d and d*d, the i64
    variance, sitofp, addf, a correctly rounded sqrt (_correctly_rounded_sqrt), divf, then the affine with
    the product clamped to the finite range before the bias is added — the clamp stands between
    the multiply and the add, which LLVM would otherwise contract into one FMA (measured on this
    backend: a single-use `x*y` feeding `- z*z` was contracted, 988 of 4096 results differed)."""
    q_n, scale, zp, weight, bias, eps = full_args(node)
    return _emit_integer_norm(em, q_n, scale, zp, weight, bias, eps, centered=True)


def _rms_norm_check(node: Node) -> str | None:
    """int8/uint8 input, static last dim, an fp32 constant weight (or none)"""
    return _integer_norm_check(node, full_args(node)[3:4])


@tosa_lowering("qlower::rms_norm_integer", check=_rms_norm_check, dynamic_dims=True)
def emit_rms_norm_integer(em: Emitter, node: Node) -> Val:
    """numerics.rms_norm_integer: the LayerNorm's emission without S1 (t = N*d, V = N*S2)."""
    q_n, scale, zp, weight, eps = full_args(node)
    return _emit_integer_norm(em, q_n, scale, zp, weight, None, eps, centered=False)


def _emit_integer_norm(em: Emitter, q_n: Node, scale, zp, weight, bias, eps, centered: bool) -> Val:
    b = em.b
    q = em.value(q_n)
    sym = list(q_n.meta["val"].shape)
    n = int(sym[-1])
    row_sym = sym[:-1] + [1]
    shape, row = q.shape, q.shape[:-1] + [1]
    i32, i64, f32 = torch.int32, torch.int64, torch.float32
    d = b.arith.subi(b.ext_i32(q).value, b.splat(shape, i32, int(zp) - q.offset, like=b.ext_i32(q).value))
    s2 = b.tosa.reduce_sum(b.arith.muli(d, d), len(shape) - 1, results=[b.ttype(row, i32)])
    t = b.arith.muli(d, b.splat(shape, i32, n, like=d))
    s2_wide = b.arith.extsi(b.ttype(row, i64), s2)
    v = b.arith.muli(s2_wide, b.splat(row, i64, n, like=s2_wide))
    if centered:
        s1 = b.tosa.reduce_sum(d, len(shape) - 1, results=[b.ttype(row, i32)])
        t = b.arith.subi(t, b.broadcast(Val(s1, i32, row), row_sym, sym).value)
        s1_wide = b.arith.extsi(b.ttype(row, i64), s1)
        v = b.arith.subi(v, b.arith.muli(s1_wide, s1_wide))
    total = b.arith.addf(b.arith.sitofp(b.ttype(row, f32), v),
                         b.splat(row, f32, numerics.layer_norm_eps_term(float(scale), n, float(eps)), like=s2))
    denom = b.broadcast(Val(_correctly_rounded_sqrt(b, total, row), f32, row), row_sym, sym).value
    y = b.arith.divf(b.arith.sitofp(b.ttype(shape, f32), t), denom)
    affine_shape = [1] * (len(shape) - 1) + [n]
    if weight is not None:
        w = em.constant(weight).detach().to(torch.float32).numpy().reshape(affine_shape)
        y = b.tosa.mul(b.ttype(shape, f32), y, b.const(w), b.const(np.zeros([1], dtype=np.int8)))
        finite = float(np.finfo(np.float32).max)
        y = b.arith.minimumf(b.arith.maximumf(y, b.splat(shape, f32, -finite, like=y)),
                             b.splat(shape, f32, finite, like=y))
    if bias is not None:
        bb = em.constant(bias).detach().to(torch.float32).numpy().reshape(affine_shape)
        y = b.tosa.add(b.ttype(shape, f32), y, b.const(bb))
    return Val(y, f32, shape)


def _correctly_rounded_sqrt(b, x, shape):
    """The correctly rounded fp32 sqrt of positive normal `x`: math.sqrt, then two rounds of
    moving one ulp towards the candidate whose square is nearest, decided in integers. On the CPU
    math.sqrt is already exact (llvm.sqrt) and nothing moves; IREE's CUDA code computes an
    approximate sqrt (measured on an H200: 11,043 of 65,536 fp32 results off; an f64 sqrt is no
    way out: IREE demotes f64 to f32 and LLVM shrinks fptrunc(sqrt(fpext x)) back anyway)."""
    i32, i64, f32 = torch.int32, torch.int64, torch.float32
    pred = b.arith.CmpIPredicate
    x_bits = b.arith.bitcast(b.ttype(shape, i32), x)
    x_exp, x_man = _exponent_mantissa(b, x_bits, shape)
    one = b.splat(shape, i32, 1, like=x_bits)

    def above_midpoint(s_bits):
        """x > ((s + next(s)) / 2)^2, exactly: s = M 2^(E-150), the midpoint (2M+1) 2^(E-151),
        x = Mx 2^(Ex-150), so the test is Mx << (Ex - 2E + 152) > (2M+1)^2 (< 2^51 for s near
        sqrt(x), where the shift is 24..27)."""
        s_exp, s_man = _exponent_mantissa(b, s_bits, shape)
        shift = b.arith.addi(b.arith.subi(x_exp, b.arith.muli(s_exp, b.splat(shape, i64, 2, like=s_exp))),
                             b.splat(shape, i64, 152, like=s_exp))
        odd = b.arith.addi(b.arith.muli(s_man, b.splat(shape, i64, 2, like=s_man)), b.splat(shape, i64, 1, like=s_man))
        return b.arith.cmpi(pred.sgt, b.arith.shli(x_man, shift), b.arith.muli(odd, odd))

    bits = b.arith.bitcast(b.ttype(shape, i32), b.math.sqrt(x))
    for _ in range(2):
        up = b.arith.extui(b.ttype(shape, i32), above_midpoint(bits))
        stay_or_up = b.arith.extui(b.ttype(shape, i32), above_midpoint(b.arith.subi(bits, one)))
        # above the midpoint below -> not down; above the one above -> up
        bits = b.arith.addi(b.arith.subi(bits, b.arith.subi(one, stay_or_up)), up)
    return b.arith.bitcast(b.ttype(shape, f32), bits)


def _exponent_mantissa(b, bits, shape):
    """(biased exponent, mantissa with the hidden bit) of positive normal fp32 `bits`, as i64."""
    i32, i64 = torch.int32, torch.int64
    exponent = b.arith.shrui(bits, b.splat(shape, i32, 23, like=bits))
    mantissa = b.arith.ori(b.arith.andi(bits, b.splat(shape, i32, 0x7FFFFF, like=bits)),
                           b.splat(shape, i32, 0x800000, like=bits))
    return b.arith.extsi(b.ttype(shape, i64), exponent), b.arith.extsi(b.ttype(shape, i64), mantissa)


def _softmax_check(node: Node) -> str | None:
    """int8/uint8 input, the int32 exp table numerics.softmax_exp_table makes"""
    q_n, table_n = full_args(node)[:2]
    table = _const(node, table_n)
    if q_n.meta["val"].dtype not in _QUANT_DTYPES:
        return "softmax of a non-8-bit value is not lowered here"
    keep = full_args(node)[2:3]
    if keep and keep[0] is not None and keep[0].meta["val"].dtype != torch.bool:
        return "the softmax's keep mask must be boolean"
    if table is None or table.numel() != 256 or int(table[0]) != 2 ** 16 or int(table[1:].max()) >= 2 ** 16 \
            or int(table.min()) < 0:
        return "the exp table must hold 2^16 at 0 and values below 2^16 elsewhere"
    return None


@tosa_lowering("qlower::softmax_integer", check=_softmax_check, dynamic_dims=True)
def emit_softmax_integer(em: Emitter, node: Node) -> Val:
    """numerics.softmax_integer: tosa.reduce_max of the stored codes (the offset keeps order),
    k = max - q in i32, the int32 table read as two byte tables through tosa.table (i8 -> i8 is
    TOSA's exact lookup; the entry T[0] = 2^16 is the one with a third byte, added where k = 0),
    i32 tosa.reduce_sum, then one divf of the two sitofp. Masked (`keep`): the codes widened to
    i32 with masked ones set to -128 (below every stored code) by arithmetic on the widened
    mask, i32 reduce_max, k clamped into the table, entries times the mask."""
    q_n, table_n, *rest = full_args(node)
    keep_n = rest[0] if rest else None
    b = em.b
    q = em.value(q_n)
    sym = list(q_n.meta["val"].shape)
    row_sym, shape = sym[:-1] + [1], q.shape
    row, axis = shape[:-1] + [1], len(shape) - 1
    i8, i32, f32 = torch.int8, torch.int32, torch.float32
    codes = b.arith.extsi(b.ttype(shape, i32), q.value)
    if keep_n is None:
        top = b.tosa.reduce_max(q.value, axis, results=[b.ttype(row, i8)])
        top = b.broadcast(Val(top, i8, row), row_sym, sym).value
        k = b.arith.subi(b.arith.extsi(b.ttype(shape, i32), top), codes)
    else:
        keep = b.broadcast(em.value(keep_n), list(keep_n.meta["val"].shape), sym).value
        kept = b.arith.extui(b.ttype(shape, i32), keep)
        lowest = b.splat(shape, i32, -128, like=codes)
        masked = b.arith.addi(b.arith.muli(b.arith.subi(codes, lowest), kept), lowest)
        top = b.tosa.reduce_max(masked, axis, results=[b.ttype(row, i32)])
        top = b.broadcast(Val(top, i32, row), row_sym, sym).value
        k = b.arith.subi(top, codes, results=[b.ttype(shape, i32)])   # top: a linalg.broadcast op
        k = b.arith.minsi(b.arith.maxsi(k, b.splat(shape, i32, 0, like=codes)), b.splat(shape, i32, 255, like=codes))
    index = b.arith.trunci(b.ttype(shape, i8), b.arith.subi(k, b.splat(shape, i32, 128, like=k)))
    table = em.constant(table_n).to(torch.int64)

    def byte(shift: int):
        entries = (((table >> shift) & 255) - 128).to(torch.int8).contiguous().numpy()
        looked_up = b.tosa.table(b.ttype(shape, i8), index, b.const(entries))
        return b.arith.addi(b.arith.extsi(b.ttype(shape, i32), looked_up), b.splat(shape, i32, 128, like=k))

    e = b.arith.addi(b.arith.muli(byte(8), b.splat(shape, i32, 256, like=k)), byte(0))
    at_max = b.arith.cmpi(b.arith.CmpIPredicate.eq, k, b.splat(shape, i32, 0, like=k))
    # + 2^16 where k = 0 (its bytes are 0): extui of the i1 mask, not a select (arith.select
    # failed to verify with a dynamic batch: "condition is signless i1 or has matching shape")
    top_entry = b.arith.muli(b.arith.extui(b.ttype(shape, i32), at_max), b.splat(shape, i32, 2 ** 16, like=k))
    e = b.arith.addi(e, top_entry)
    if keep_n is not None:
        e = b.arith.muli(e, kept)
    total = b.tosa.reduce_sum(e, axis, results=[b.ttype(row, i32)])
    total = b.broadcast(Val(b.arith.sitofp(b.ttype(row, f32), total), f32, row), row_sym, sym).value
    return Val(b.arith.divf(b.arith.sitofp(b.ttype(shape, f32), e), total), f32, shape)


def _integer_clamp_check(node: Node) -> str | None:
    """int8/uint8 input, Python-number bounds (a ReLU on quantized values that the lowering pass
    could not fold into a requantize, e.g. because the value has another user); on a dynamic
    shape, not a clamp to one value (_FILL_REFUSAL)"""
    args = full_args(node)
    if args[0].meta["val"].dtype not in _QUANT_DTYPES or node.meta["val"].dtype != args[0].meta["val"].dtype:
        return "clamp of a non-8-bit tensor (or with float bounds, which promote it) is not lowered here"
    if not all(b is None or (isinstance(b, (int, float)) and not isinstance(b, bool)) for b in args[1:3]):
        return "clamp with tensor bounds is not lowered"
    lo, hi = _clamp_bounds(node)
    if lo >= hi and DYN in dims(node.meta["val"].shape):
        return f"a clamp to {_FILL_REFUSAL}"
    return None


def _clamp_bounds(node: Node) -> tuple[int, int]:
    """The clamp's bounds on codes: rounded inwards to integers, cut to the dtype's range."""
    args = full_args(node)
    lo_nat, hi_nat = numerics.dtype_range(node.meta["val"].dtype)
    name = node.target._schema.name
    lo = args[1] if name != "aten::clamp_max" else None
    hi = args[1] if name == "aten::clamp_max" else args[2] if name == "aten::clamp" else None
    lo = lo_nat if lo is None else min(max(math.ceil(lo), lo_nat), hi_nat)
    hi = hi_nat if hi is None else max(min(math.floor(hi), hi_nat), lo_nat)
    return lo, hi


@tosa_lowering("aten::clamp", "aten::clamp_min", "aten::clamp_max", check=_integer_clamp_check, dynamic_dims=True)
def emit_integer_clamp(em: Emitter, node: Node) -> Val:
    """tosa.clamp on stored values (the offset keeps order): exactly torch's clamp of the 8-bit
    tensor, bounds rounded inwards to integers and cut to the dtype's range; min > max gives
    max everywhere, as in torch."""
    x = em.value(full_args(node)[0])
    lo, hi = _clamp_bounds(node)
    if lo >= hi:   # one value everywhere (a ReLU of a value whose zero point is its top)
        b = em.b
        return Val(b.splat(x.shape, torch.int8, hi - x.offset, like=x.value), x.dtype, x.shape, x.offset)
    return _clamp_stored(em, x, lo, hi)


@tosa_lowering("qlower::mean", check=_mean_check)
def emit_mean(em: Emitter, node: Node) -> Val:
    """clamp(RNE(sum(q - zp) / N) + zp): int32 tosa.reduce_sum, then the exact half-to-even
    integer division of numerics.mean_integer in arith (floordiv, remainder, odd test)."""
    q_n, zp, reduced, keepdim, qmin, qmax = full_args(node)
    b = em.b
    q = em.value(q_n)
    reduced = sorted(d % len(q.shape) for d in reduced)
    q32 = b.ext_i32(q)
    centered = Val(b.arith.subi(q32.value, b.splat(q.shape, torch.int32, zp - q.offset, like=q32.value)), torch.int32,
                   q.shape)
    for d in reduced:
        shape = [1 if i == d else s for i, s in enumerate(centered.shape)]
        centered = Val(b.tosa.reduce_sum(centered.value, d, results=[b.ttype(shape, torch.int32)]),
                       torch.int32, shape)
    total, n = centered, math.prod(q.shape[d] for d in reduced)
    y = _round_div_even(em, total, n)
    y = b.arith.addi(y, b.splat(total.shape, torch.int32, zp - q.offset, like=total.value))
    lo = b.splat(total.shape, torch.int32, qmin - q.offset, like=total.value)
    hi = b.splat(total.shape, torch.int32, qmax - q.offset, like=total.value)
    y = b.arith.minsi(b.arith.maxsi(y, lo), hi)
    out = Val(b.arith.trunci(b.ttype(total.shape, torch.int8), y), q.dtype, total.shape, q.offset)
    return out if keepdim else b.reshape(out, dims(node.meta["val"].shape))


def _round_div_even(em: Emitter, total: Val, n: int):
    """RNE(total / n) for int32 total and positive n, exactly (numerics.mean_integer)."""
    b, s, i32 = em.b, total.shape, torch.int32
    nn = b.splat(s, i32, n, like=total.value)
    quot = b.arith.floordivsi(total.value, nn)
    twice_rem = b.arith.muli(b.arith.subi(total.value, b.arith.muli(quot, nn)), b.splat(s, i32, 2, like=total.value))
    pred = b.arith.CmpIPredicate
    above = b.arith.cmpi(pred.sgt, twice_rem, nn)
    tie = b.arith.cmpi(pred.eq, twice_rem, nn)
    one = b.splat(s, i32, 1, like=total.value)
    odd = b.arith.cmpi(pred.eq, b.arith.andi(quot, one), one)
    up = b.arith.ori(above, b.arith.andi(tie, odd))
    return b.arith.addi(quot, b.arith.extui(b.ttype(s, i32), up))


# ------------------------------------------------------------------ shape ops on integers
_RESHAPES = ("aten::reshape", "aten::view", "aten::_unsafe_view", "aten::flatten.using_ints", "aten::unsqueeze",
             "aten::squeeze.dim", "aten::squeeze.dims", "aten::squeeze")
_IDENTITIES = ("aten::contiguous", "aten::clone", "aten::alias")


@tosa_lowering(*_RESHAPES, check=integer_input, dynamic_dims=True)
def emit_reshape(em: Emitter, node: Node) -> Val:
    return _to_output_shape(em, em.value(node.all_input_nodes[0]), node, _input_shape(node))


FLOAT_SHAPE_OPS = _RESHAPES + ("aten::expand",)


def emits_float_shape_op(node: Node, available: frozenset) -> bool:
    """`float_shape_op` takes `node` in a TOSA module whose arguments have the dims `available`:
    a reshape or expand whose symbolic output sizes are sums / products of those (bloom's
    `4*batch`; BERT's mask expanded to [batch, 1, seq, seq])."""
    val = node.meta.get("val")
    return schema_name(node) in FLOAT_SHAPE_OPS and isinstance(val, torch.Tensor) and \
        all(isinstance(d, int) or computable_from(d, available) for d in val.shape)


def float_shape_op(em: Emitter, node: Node) -> Val | None:
    """A non-int8 tensor's reshape or expand in a TOSA module, emitted by qlower (tosa.reshape /
    tensor.reshape, linalg.broadcast) with sizes computed from the function's argument dims;
    None when `node` is neither or a size is not a product of those dims (the importer takes it
    then). Imported alone, torch-mlir gets these wrong or cannot size them: a reshape merging
    two dynamic dims became a cast fixing one to 1; an expand to a size that none of the lone
    op's inputs has cannot be computed inside its function (BERT's mask, ViT's class token)."""
    name, val = schema_name(node), node.meta.get("val")
    if name not in FLOAT_SHAPE_OPS or not isinstance(val, torch.Tensor):
        return None
    x = node.all_input_nodes[0]
    try:
        if name == "aten::expand":
            return em.b.broadcast(em.value(x), list(x.meta["val"].shape), list(val.shape))
        return _to_output_shape(em, em.value(x), node, _input_shape(node))
    except NotImplementedError:
        return None


@tosa_lowering("aten::permute", check=integer_input, dynamic_dims=True)
def emit_permute(em: Emitter, node: Node) -> Val:
    x = em.value(node.args[0])
    return em.b.transpose(x, [d % len(x.shape) for d in node.args[1]])


@tosa_lowering("aten::transpose.int", check=integer_input, dynamic_dims=True)
def emit_transpose(em: Emitter, node: Node) -> Val:
    x = em.value(node.args[0])
    perm = list(range(len(x.shape)))
    d0, d1 = node.args[1] % len(perm), node.args[2] % len(perm)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return em.b.transpose(x, perm)


def _static_range(x, dim, start, end, step) -> range | None:
    """The indices a slice of `x` along `dim` keeps, or None when that dim or a bound is symbolic."""
    size = x.shape[dim % x.dim()]
    if (not all(isinstance(v, int) for v in (size, step))
            or not all(v is None or isinstance(v, int) for v in (start, end))):
        return None
    return range(size)[slice(start, end, step)]


def _slice_check(node: Node) -> str | None:
    """an integer tensor sliced along a static dim with constant bounds (other dims may be
    dynamic), keeping at least one element"""
    why = integer_input(node)
    if why is not None:
        return why
    x, (_, dim, start, end, step) = node.args[0].meta["val"], full_args(node)
    kept = _static_range(x, dim, start, end, step)
    if kept is None:
        return "a slice along a dynamic dim, or with symbolic bounds"
    return None if len(kept) else "an empty slice"


def _extract(em: Emitter, x: Val, dim: int, kept: range, out_shape) -> Val:
    """tensor.extract_slice of `x`: `kept` along `dim`, every element of the other dims (their
    dynamic sizes computed from the function's argument dims). One element along `dim` with
    a dynamic dim elsewhere: a gathering copy instead (`_gathered_slice`)."""
    from iree.compiler.dialects import tensor
    if _needs_gather(x, kept, out_shape):
        return _gathered_slice(em, x, dim, kept, out_shape)
    rank, dynamic = len(x.shape), em.b.ir.ShapedType.get_dynamic_size()
    offsets, strides = [0] * rank, [1] * rank
    offsets[dim], strides[dim] = kept.start, kept.step
    sizes = [s if isinstance(s, int) else dynamic for s in out_shape]
    out = tensor.extract_slice(em.b.ttype(dims(out_shape), x.dtype), x.value, [],
                               [em.b.index(s) for s in out_shape if not isinstance(s, int)], [],
                               offsets, sizes, strides)
    return Val(out, x.dtype, dims(out_shape), x.offset)



def _needs_gather(x: Val, kept: range, out_shape) -> bool:
    """A slice IREE would write as a rank-reducing extract_slice (one element along its dim)
    with a dynamic dim: the case `_gathered_slice` avoids. Wider slices of the same programs
    (halves, [B, 4] -> [B, 2]) compile as extract_slice, which stays: the gathering copy cost the
    int8 LLaMA (rotary halves) with batch and sequence dynamic 1.80 -> 2.17 ms at 8 x 40."""
    return len(kept) == 1 and DYN in dims(out_shape) and x.dtype is not torch.bool   # i1: not measured


def _gathered_slice(em: Emitter, x: Val, dim: int, kept: range, out_shape) -> Val:
    """A slice of `x` with a dynamic dim as a `linalg.generic` that reads `x` with tensor.extract
    (a private function `main` calls), not `tensor.extract_slice`: IREE 3.13 moves an
    extract_slice up through the elementwise ops that made `x` into their dispatch, and where one
    of those values also feeds a reduction there (an RMSNorm of [B, 4] whose output is sliced to
    [B, 1], B dynamic) it puts the whole [B, 4] intermediate on the stack at its unbounded size:
    "exceeded stack allocation limit of 32768 bytes ... Got 144115188075856064 bytes" (found by
    the IREE fuzz run; a slice of two or more elements compiles). The
    gathering copy is a dispatch of its own."""
    rank, name = len(x.shape), f"gathered_slice_{em.private_functions}"
    out_type = em.b.ttype(dims(out_shape), x.dtype)
    xt, ot, element = em.b.ttype(x.shape, x.dtype), out_type, em.b.elem(x.dtype)
    parallel = ", ".join(['"parallel"'] * rank)
    lines = [f"func.func private @{name}(%x: {xt}) -> {ot} {{"]
    sizes = []
    for d, size in enumerate(dims(out_shape)):
        if size == DYN:   # only the kept dim is cut; every dynamic dim is x's
            lines += [f"  %c{d} = arith.constant {d} : index", f"  %n{d} = tensor.dim %x, %c{d} : {xt}"]
            sizes.append(f"%n{d}")
    loops = ", ".join(f"d{d}" for d in range(rank))
    lines += [f"  %e = tensor.empty({', '.join(sizes)}) : {ot}",
              f"  %r = linalg.generic {{indexing_maps = [affine_map<({loops}) -> ({loops})>], "
              f"iterator_types = [{parallel}]}} outs(%e : {ot}) {{",
              f"  ^bb0(%o: {element}):"]
    lines += [f"    %i{d} = linalg.index {d} : index" for d in range(rank)]
    lines += [f"    %step = arith.constant {kept.step} : index", f"    %start = arith.constant {kept.start} : index",
              f"    %scaled = arith.muli %i{dim}, %step : index", "    %j = arith.addi %scaled, %start : index"]
    index = ", ".join("%j" if d == dim else f"%i{d}" for d in range(rank))
    lines += [f"    %v = tensor.extract %x[{index}] : {xt}", f"    linalg.yield %v : {element}",
              f"  }} -> {ot}", f"  return %r : {ot}", "}"]
    (out,) = em.call_text_function("\n".join(lines), name, [x.value], [out_type])
    return Val(out, x.dtype, dims(out_shape), x.offset)


@tosa_lowering("aten::slice.Tensor", check=_slice_check, dynamic_dims=True)
def emit_slice(em: Emitter, node: Node) -> Val:
    """A slice of stored integer values (exact: data movement; rotary's halves of an int8 q/k)."""
    x, (_, dim, start, end, step) = node.args[0].meta["val"], full_args(node)
    dim %= x.dim()
    return _extract(em, em.value(node.args[0]), dim, _static_range(x, dim, start, end, step), node.meta["val"].shape)


def _split_check(node: Node) -> str | None:
    """an integer tensor split along a static dim"""
    why = integer_input(node)
    if why is not None:
        return why
    x, dim = node.args[0].meta["val"], full_args(node)[2]
    return None if isinstance(x.shape[dim % x.dim()], int) else "a split along a dynamic dim"


@tosa_lowering("aten::split.Tensor", "aten::split_with_sizes", "aten::chunk", check=_split_check, dynamic_dims=True)
def emit_split(em: Emitter, node: Node) -> list[Val]:
    """The pieces of a split / chunk of stored integer values (GPT-2's q/k/v, NeoX's chunk), one
    slice each; the graph's getitems pick them."""
    dim = full_args(node)[2] % node.args[0].meta["val"].dim()
    v, pieces, start = em.value(node.args[0]), [], 0
    for out in node.meta["val"]:
        length = out.shape[dim]
        pieces.append(_extract(em, v, dim, range(start, start + length), out.shape))
        start += length
    return pieces


def _expand_check(node: Node) -> str | None:
    """an integer tensor expanded along static dims of size 1 (no new leading dims)"""
    why = integer_input(node)
    if why is not None:
        return why
    x, out = node.args[0].meta["val"], node.meta["val"]
    if x.dim() != out.dim():
        return "an expand that adds leading dims"
    if any(str(i) != str(o) and not (isinstance(i, int) and i == 1 and isinstance(o, int))
           for i, o in zip(x.shape, out.shape)):
        return "an expand to a dynamic size"
    return None


@tosa_lowering("aten::expand", check=_expand_check, dynamic_dims=True)
def emit_expand(em: Emitter, node: Node) -> Val:
    """tosa.tile of stored integer values (GQA's repeat of an int8 k/v: exact data movement)."""
    x, out = em.value(node.args[0]), node.meta["val"].shape
    multiples = [o if i == 1 and isinstance(o, int) else 1 for i, o in zip(x.shape, out)]
    if all(m == 1 for m in multiples):
        return x
    shape = [m * d if d != DYN else DYN for m, d in zip(multiples, x.shape)]
    tiled = em.b.tosa.tile(em.b.ttype(shape, x.dtype), x.value, em.b.shape_value(multiples))
    return Val(tiled, x.dtype, shape, x.offset)


@tosa_lowering(*_IDENTITIES, check=integer_input, dynamic_dims=True)
def emit_identity(em: Emitter, node: Node) -> Val:
    return em.value(node.args[0])


def _cat_check(node: Node) -> str | None:
    """non-empty integer tensors of one dtype (the graph gives a quantized cat's inputs one scale
    and zero point, so the cat moves stored values)"""
    tensors = node.args[0]
    if not isinstance(tensors, (list, tuple)) or not tensors or not all(isinstance(t, Node) for t in tensors):
        return "cat of something other than a list of tensors"
    vals = [t.meta["val"] for t in tensors]
    if len({v.dtype for v in vals}) != 1 or vals[0].dtype not in INTEGER_DTYPES:
        return "cat of float or mixed-dtype tensors (floats go through the torch importer)"
    if any(isinstance(n, int) and n == 0 for v in vals for n in v.shape):
        return "cat of an empty tensor (torch skips some of those) is not lowered"
    return None


@tosa_lowering("aten::cat", check=_cat_check)
def emit_cat(em: Emitter, node: Node) -> Val:
    """tosa.concat on stored values: exactly torch.cat of the integer tensors."""
    vals = [em.value(t) for t in node.args[0]]
    dim = full_args(node)[1] % len(vals[0].shape)
    shape = dims(node.meta["val"].shape)
    out = em.b.tosa.concat([v.value for v in vals], dim, results=[em.b.ttype(shape, vals[0].dtype)])
    return Val(out, vals[0].dtype, shape, vals[0].offset)


def _getitem_check(node: Node) -> str | None:
    """picks an output of a lowered op (TOSA or importer)"""
    producer = node.args[0]
    if not isinstance(producer, Node) or kind_of(producer) is None:
        return "getitem of an op that is not lowered"
    return None


@tosa_lowering("getitem", check=_getitem_check, dynamic_dims=True)
def emit_getitem(em: Emitter, node: Node) -> Val:
    return em.env[node.args[0]][node.args[1]]


def _select(em: Emitter, x: Val, dim: int, index: int, out_shape) -> Val:
    """x[..., index, ...] along `dim` (tosa.slice of width 1, then the dim reshaped away to
    `out_shape`, the node's symbolic output shape)."""
    start = [0] * len(x.shape)
    start[dim] = index
    size = list(x.shape)
    size[dim] = 1
    b = em.b
    if _needs_gather(x, range(index, index + 1), size):   # IREE's rank-reducing slice (_gathered_slice)
        return b.reshape(_gathered_slice(em, x, dim, range(index, index + 1), size),
                         [s for i, s in enumerate(x.shape) if i != dim], list(out_shape))
    out = b.tosa.slice(b.ttype(size, x.dtype), x.value, b.shape_value(start), b.shape_value(size))
    return b.reshape(Val(out, x.dtype, size, x.offset), [s for i, s in enumerate(x.shape) if i != dim], list(out_shape))


def _sliced_dim_check(node: Node) -> str | None:
    """integer tensor, static size along the dim it slices"""
    why = integer_input(node)
    if why is not None:
        return why
    x = node.args[0].meta["val"]
    dim = node.args[1] if len(node.args) > 1 else 0
    return static_dims(node, x, [dim % x.dim()], "the dim unbind/select slices")


@tosa_lowering("aten::unbind.int", check=_sliced_dim_check, dynamic_dims=True)
def emit_unbind(em: Emitter, node: Node) -> list[Val]:
    x = em.value(node.args[0])
    dim = (node.args[1] if len(node.args) > 1 else 0) % len(x.shape)
    return [_select(em, x, dim, i, out.shape) for i, out in zip(range(x.shape[dim]), node.meta["val"])]


@tosa_lowering("aten::select.int", check=_sliced_dim_check, dynamic_dims=True)
def emit_select(em: Emitter, node: Node) -> Val:
    x = em.value(node.args[0])
    dim = node.args[1] % len(x.shape)
    return _select(em, x, dim, node.args[2] % x.shape[dim], node.meta["val"].shape)
