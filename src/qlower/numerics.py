"""THE canonical quantization numerics of qlower. Every other module calls these functions;
there is no second copy of this math anywhere (see docs/numerics.md).

Contract (all tensors on CPU):
- quantize:   q = clamp(RNE(fp32(x) / fp32(s)) + zp, qmin, qmax)
              IEEE fp32 *division* (not a reciprocal multiply), round half to even, zero point
              added after rounding (in the integer domain), +-inf saturate to qmax/qmin,
              NaN -> qmin (the ONNX Runtime/MLAS behaviour, so the onnxruntime backend agrees).
- dequantize: x = fp32(int32(q) - zp) * fp32(s)
- bias:       b_q = RNE(fp64(b) / fp64(s_acc)) as int32, s_acc = fp32(sx * sw); overflow -> error
- requantize, two profiles (acc is the int32 accumulator, s_acc its fp32 scale):
  * "float": M = fp32(s_acc / sy)   (ONNX Runtime QLinearConv/QLinearMatMul order:
                                    fp32(fp32(sx*sw)/sy));  y = clamp(RNE(fp32(acc) * M) + zy)
  * "fixed": TOSA RESCALE, SINGLE_ROUND: (m, shift) from fp64(s_acc)/fp64(sy) as TOSA's
             reference utilities derive it; y = clamp(((int64(acc) * m + 2^(shift-1)) >> shift) + zy)
- per-token dynamic quantization (linear inputs, scale computed at run time per row):
  s_t = max(fp32(max_k |x[t, k]|) / 127, 2^-149) (IEEE fp32 division; never 0),
  q = clamp(RNE(x / s_t), -128, 127) + 128 stored as uint8 with zero point 128 (uint8
  saturation; the row maximum lands on +-127; uint8 storage so the u8 x s8 GEMM kernels apply),
  and the int32 accumulator is dequantized as y = fp32(fp32(fp32(acc) * s_w) * s_t).
- per-tensor dynamic quantization (linear inputs, ONNX DynamicQuantizeLinear's uint8 scheme, the
  one ONNX Runtime's `quantize_dynamic` uses): lo = min(min x, 0), hi = max(max x, 0),
  s = 1 if hi == lo else fp32(fp32(hi - lo) / 255), zp = RNE(clamp(0 - fp32(lo / s), 0, 255)),
  q = clamp(RNE(x / s) + zp, 0, 255) (quantize above), and the int32 accumulator of a linear is
  y = fp32(fp32(acc) * fp32(s * s_w)) + b (the product of the two scales first, then the bias).
- LayerNorm of an 8-bit per-tensor value q (scale s, zero point zp) over its last dim (N codes):
  d = q - zp, S1 = sum d, S2 = sum d^2 (int32, exact), t = N*d - S1 (int32),
  V = N*S2 - S1^2 (int64, exact), D = sqrt(fp32(fp32(V) + fp32(eps*N^2/s^2))) correctly rounded,
  y = fp32(t) / D, then y * weight clamped to +-FP32_MAX, then + bias (fp32, one rounding each;
  the clamp keeps every backend from fusing the multiply into the add):
  (x - mean)/sqrt(var + eps) rewritten so that the statistics are exact integers.
- RMSNorm likewise, without the mean: t = N*d, V = N*S2 (int64), D as above, y = fp32(t) / D,
  then y * weight clamped: x / sqrt(mean(x^2) + eps) = N*d / sqrt(N*S2 + eps*N^2/s^2).
- softmax over the last dim of an 8-bit per-tensor value q (scale s): k = max(q) - q in [0, 255],
  E = T[k] with T[k] = RNE(2^16 * exp(-s*k)) (int32, computed in float64 once), S = sum E (int32,
  exact), p = fp32(E) / fp32(S) (one IEEE division): softmax's exp(x - max) / sum on a 2^-16 grid.
- table lookup (a float pointwise region between an 8-bit dequantize and an 8-bit quantize, e.g.
  DQ -> GELU -> Q): y = T[q - dtype_min(q)] with T = Q(f(DQ(c))) evaluated once per code c at
  compile time: exact integer data movement on every backend (tabulate_pointwise).
- weight-only linear (W4A16 / W8A16: float activations, b-bit weight codes in groups of g
  consecutive input features of one output row; per output channel: g = in_features; a last,
  shorter group where g does not divide it):
  asymmetric: lo = min(min w, 0), hi = max(max w, 0) over the group, s = max(fp32(hi - lo) /
  (2^b - 1), FP32_EPS), zp = clamp(RNE(-lo / s), 0, 2^b - 1) (torchao's choose_qparams_affine,
  ASYMMETRIC, integer zero point, preserve_zero); symmetric: s = max(fp32(max |w|) /
  (2^(b-1) - 1), FP32_EPS), zp = 2^(b-1) (codes [1, 2^b - 1], the group's maximum magnitude
  lands on a code); codes u = clamp(RNE(w / s) + zp, 0, 2^b - 1) (quantize above), stored
  unsigned (uint8, one code each); w_fp = fp32(int32(u) - zp) * s (dequantize: exact but for
  one rounding); y = fp32 matmul(x, w_fp^T) (+ b) — the engine's fp32 sum order, so an engine
  agrees with the reference within the reordered-sum bound `reordered_sum_bound`.
  Clipping (AWQ's, before the qparams): each group clamped to [-r * max |w|, r * max |w|], r in
  (0, 1] per group (fp32 product): with a one-sided outlier only that side of the range shrinks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from .errors import NumericsError

Profile = Literal["float", "fixed"]
PROFILES: tuple[str, ...] = ("float", "fixed")

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

_DTYPE_RANGE = {
    torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int16: (-32768, 32767),
    torch.int32: (INT32_MIN, INT32_MAX),
}


def dtype_range(dtype: torch.dtype) -> tuple[int, int]:
    """Natural [qmin, qmax] of an integer storage dtype."""
    if dtype not in _DTYPE_RANGE:
        raise NumericsError(f"unsupported quantized storage dtype {dtype}",
                            hint="use torch.uint8, torch.int8, torch.int16 or torch.int32")
    return _DTYPE_RANGE[dtype]


def _per_axis(t: torch.Tensor, like: torch.Tensor, axis: int | None) -> torch.Tensor:
    """Reshape a per-channel parameter vector so it broadcasts along `axis` of `like`. A
    parameter of `like`'s own shape (one per element), or of its rank with no axis (one per
    block, broadcast: weight groups' [N, G, 1] against [N, G, g]), is used as it is."""
    if t.dim() > 1 and (t.shape == like.shape or (axis is None and t.dim() == like.dim())):
        return t
    if axis is None or t.numel() == 1:
        return t.reshape(())
    shape = [1] * like.dim()
    shape[axis] = t.numel()
    return t.reshape(shape)


def _as_f32(v) -> torch.Tensor:
    return torch.as_tensor(v, dtype=torch.float32)


def _as_i32(v) -> torch.Tensor:
    return torch.as_tensor(v).to(torch.int32)


def quantize(x: torch.Tensor, scale, zero_point, qmin: int, qmax: int, dtype: torch.dtype,
             axis: int | None = None) -> torch.Tensor:
    """q = clamp(RNE(x / s) + zp, qmin, qmax); NaN -> qmin. See module docstring."""
    x = x.to(torch.float32)
    s = _per_axis(_as_f32(scale), x, axis)
    zp = _per_axis(_as_i32(zero_point), x, axis)
    r = torch.round(x / s)  # IEEE fp32 division, torch.round is half-to-even
    # Clamping the rounded value to [qmin-zp, qmax-zp] in float is exact (all integers involved
    # are < 2^24) and equals clamping after adding zp in int32; it also saturates +-inf.
    lo, hi = (qmin - zp).to(torch.float32), (qmax - zp).to(torch.float32)
    r = torch.minimum(torch.maximum(r, lo), hi)
    r = torch.where(torch.isnan(r), lo, r)
    return (r.to(torch.int32) + zp).to(dtype)


def dequantize(q: torch.Tensor, scale, zero_point, axis: int | None = None) -> torch.Tensor:
    """x = fp32(int32(q) - zp) * s."""
    q32 = q.to(torch.int32)
    s = _per_axis(_as_f32(scale), q32, axis)
    zp = _per_axis(_as_i32(zero_point), q32, axis)
    return (q32 - zp).to(torch.float32) * s


def accumulator_scale(x_scale, w_scale) -> torch.Tensor:
    """fp32(sx * sw): the scale of an int32 accumulator (and of a quantized bias)."""
    return _as_f32(x_scale) * _as_f32(w_scale)


def quantize_bias(bias: torch.Tensor, acc_scale) -> torch.Tensor:
    """b_q = RNE(b / s_acc) in int32 (computed in fp64); raises if any value overflows int32."""
    s = _as_f32(acc_scale).to(torch.float64).reshape(-1)
    q = torch.round(bias.to(torch.float64) / (s if s.numel() > 1 else s.reshape(())))
    if q.numel() and (not bool(torch.isfinite(q).all()) or q.abs().max().item() > INT32_MAX):
        raise NumericsError("quantized bias overflows int32",
                            hint="the activation or weight scale is too small for this bias")
    return q.to(torch.int32)


# ---------------------------------------------------------------- requantize: float profile
def float_multiplier(acc_scale, out_scale) -> torch.Tensor:
    """M = fp32(s_acc / sy), in fp32 exactly as ONNX Runtime's QLinear kernels compute it."""
    return _as_f32(acc_scale) / _as_f32(out_scale)


def requantize_float(acc: torch.Tensor, multiplier, out_zp: int, qmin: int, qmax: int,
                     dtype: torch.dtype, axis: int | None = None) -> torch.Tensor:
    """y = clamp(RNE(fp32(acc) * M) + zy). fp32(acc) drops low bits when |acc| > 2^24; that is
    the documented behaviour of this profile (and of ONNX Runtime)."""
    m = _per_axis(_as_f32(multiplier), acc, axis)
    v = torch.round(acc.to(torch.float32) * m)
    v = torch.clamp(v, float(qmin - out_zp), float(qmax - out_zp))
    return (v.to(torch.int32) + int(out_zp)).to(dtype)


# ---------------------------------------------------------------- requantize: fixed profile
@dataclass(frozen=True)
class FixedMultiplier:
    """TOSA RESCALE parameters: value * scale ~= (value * multiplier) >> shift."""
    multiplier: int
    shift: int


def fixed_multiplier(scale: float) -> FixedMultiplier:
    """Derive a 32-bit (multiplier, shift) from a positive float scale the way TOSA's reference
    utilities do: frexp, round-half-away of mantissa * 2^31, renormalise m == 2^31, and fold
    shifts above 62 into the multiplier. Raises if the scale needs shift < 2."""
    if not (scale > 0.0 and math.isfinite(scale)):
        raise NumericsError(f"requantization scale must be positive and finite, got {scale!r}")
    mantissa, exponent = math.frexp(scale)
    m = int(math.floor(abs(mantissa) * (1 << 31) + 0.5))  # round half away from zero (m > 0)
    if m == (1 << 31):
        m //= 2
        exponent += 1
    shift = 31 - exponent
    if shift > 62:
        m >>= min(31, shift - 62)
        shift = 62
    if shift < 2:
        raise NumericsError(f"requantization scale {scale!r} is too large for TOSA RESCALE",
                            hint="scales >= 2^29 cannot be expressed with shift >= 2")
    return FixedMultiplier(m, shift)


def fixed_scale(acc_scale: float, out_scale: float) -> float:
    """The real scale the fixed profile approximates: fp64(s_acc) / fp64(sy)."""
    return float(acc_scale) / float(out_scale)


def requantize_fixed(acc: torch.Tensor, multipliers: list[FixedMultiplier], out_zp: int,
                     qmin: int, qmax: int, dtype: torch.dtype, axis: int | None = None) -> torch.Tensor:
    """TOSA RESCALE SINGLE_ROUND: ((int64(acc) * m + 2^(shift-1)) >> shift) + zy, clamped.
    Arithmetic shift right rounds toward -inf, so the tie rule is half toward +inf."""
    a = acc.to(torch.int64)
    m = _per_axis(torch.tensor([f.multiplier for f in multipliers], dtype=torch.int64), a, axis)
    sh = _per_axis(torch.tensor([f.shift for f in multipliers], dtype=torch.int64), a, axis)
    # |acc| < 2^31 and m < 2^31, so the product fits int64 without overflow.
    v = torch.bitwise_right_shift(a * m + torch.bitwise_left_shift(torch.ones_like(sh), sh - 1), sh)
    v = torch.clamp(v + int(out_zp), qmin, qmax)
    return v.to(dtype)


def requantize(acc: torch.Tensor, acc_scale, out_scale: float, out_zp: int, qmin: int, qmax: int,
               dtype: torch.dtype, axis: int | None = None, profile: Profile = "float") -> torch.Tensor:
    """Requantize an int32 accumulator of scale `acc_scale` (per-tensor or per-`axis`) to an
    integer tensor of scale `out_scale`, under the named profile."""
    if profile == "float":
        return requantize_float(acc, float_multiplier(acc_scale, out_scale), out_zp, qmin, qmax,
                                dtype, axis)
    if profile == "fixed":
        scales = _as_f32(acc_scale).reshape(-1).tolist()
        mults = [fixed_multiplier(fixed_scale(s, out_scale)) for s in scales]
        return requantize_fixed(acc, mults, out_zp, qmin, qmax, dtype, axis)
    raise NumericsError(f"unknown numerics profile {profile!r}", hint=f"use one of {PROFILES}")


def mean_integer(q: torch.Tensor, zero_point: int, dims: list[int], keepdim: bool, qmin: int, qmax: int,
                 dtype: torch.dtype) -> torch.Tensor:
    """Mean of a quantized tensor over `dims`, same qparams in and out:
    clamp(RNE(sum(q - zp) / N) + zp), with the division rounded exactly (half to even) in integers.
    Equals Q(mean(DQ(q))) except where fp32 rounding of the float mean lands across a tie."""
    centered = q.to(torch.int64) - int(zero_point)
    total = centered.sum(dim=dims, keepdim=keepdim)
    n = 1
    for d in dims:
        n *= q.shape[d]
    quotient = torch.div(total, n, rounding_mode="floor")
    twice_rem = 2 * (total - quotient * n)
    up = (twice_rem > n) | ((twice_rem == n) & (quotient % 2 == 1))
    return torch.clamp(quotient + up.to(torch.int64) + int(zero_point), qmin, qmax).to(dtype)


FP32_MAX = float(torch.finfo(torch.float32).max)
LAYER_NORM_MAX_N = 33025   # N * 255^2 < 2^31: S2 stays inside int32


def layer_norm_eps_term(scale: float, n: int, eps: float) -> float:
    """fp32(eps * N^2 / s^2): the variance's epsilon in the integer statistics' units."""
    return float(torch.tensor(eps * n * n / (float(scale) ** 2), dtype=torch.float64).to(torch.float32))


def layer_norm_integer(q: torch.Tensor, scale: float, zero_point: int, weight: torch.Tensor | None,
                       bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm over the last dim of an 8-bit per-tensor quantized value (module docstring)."""
    n = q.shape[-1]
    d = q.to(torch.int32) - int(zero_point)
    s1 = d.sum(-1, keepdim=True, dtype=torch.int32)
    s2 = (d * d).sum(-1, keepdim=True, dtype=torch.int32)
    t = n * d - s1
    v = n * s2.to(torch.int64) - s1.to(torch.int64) * s1.to(torch.int64)
    return _normalized(t, v, scale, n, eps, weight, bias)


def rms_norm_integer(q: torch.Tensor, scale: float, zero_point: int, weight: torch.Tensor | None,
                     eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of an 8-bit per-tensor quantized value (module docstring):
    layer_norm_integer without the mean, x / sqrt(mean(x^2) + eps) = N*d / sqrt(N*S2 + eps*N^2/s^2)."""
    n = q.shape[-1]
    d = q.to(torch.int32) - int(zero_point)
    s2 = (d * d).sum(-1, keepdim=True, dtype=torch.int32)
    return _normalized(n * d, n * s2.to(torch.int64), scale, n, eps, weight, None)


def _normalized(t: torch.Tensor, v: torch.Tensor, scale: float, n: int, eps: float,
                weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """fp32(t) / sqrt(fp32(fp32(v) + eps term)), then the affine: the float tail both integer
    norms share, each step one IEEE operation."""
    total = v.to(torch.float32) + torch.tensor(layer_norm_eps_term(scale, n, eps), dtype=torch.float32)
    # fp64 sqrt rounded to fp32 is the correctly rounded fp32 sqrt (53 >= 2*24 + 2); PyTorch's
    # own fp32 sqrt is not (measured, AMD EPYC: 202,029 of 2^20 random inputs differ)
    denom = torch.sqrt(total.to(torch.float64)).to(torch.float32)
    y = t.to(torch.float32) / denom
    if weight is not None:   # clamped so that no backend can fuse the multiply into the add (FMA)
        y = torch.clamp(y * weight.to(torch.float32), -FP32_MAX, FP32_MAX)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y


SOFTMAX_EXP_BITS = 16
SOFTMAX_MAX_N = (2 ** 31 - 1) // 2 ** SOFTMAX_EXP_BITS   # sum E stays inside int32


def softmax_exp_table(scale: float) -> torch.Tensor:
    """T[k] = RNE(2^16 * exp(-s*k)) for k = 0..255, int32 (T[0] = 2^16, the row maximum)."""
    k = torch.arange(256, dtype=torch.float64)
    return torch.round(torch.exp(-float(scale) * k) * 2.0 ** SOFTMAX_EXP_BITS).to(torch.int32)


def softmax_integer(q: torch.Tensor, table: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dim of an 8-bit value from an exp table (module docstring).

    keep (bool, broadcastable to q): the masked softmax `softmax(masked_fill(x, ~keep, -inf))`,
    attention's padding mask. The row maximum is taken over kept codes only (a masked code above
    it would push every kept entry down the table, to 0 for a range wider than ~11 e-folds),
    masked entries count 0, and a row with nothing kept is 0/0 = NaN, as eager's softmax of -inf."""
    codes = q.to(torch.int32)
    if keep is None:
        e = table[(codes.amax(-1, keepdim=True) - codes).to(torch.int64)]
    else:
        lo, hi = dtype_range(q.dtype)
        top = codes.masked_fill(~keep, lo).amax(-1, keepdim=True)
        e = table[(top - codes).clamp(0, hi - lo).to(torch.int64)] * keep.to(torch.int32)
    total = e.sum(-1, keepdim=True, dtype=torch.int32)
    return e.to(torch.float32) / total.to(torch.float32)


def table_codes(dtype: torch.dtype) -> torch.Tensor:
    """Every code of an 8-bit dtype in index order: the inputs a lookup table is built from."""
    lo, hi = dtype_range(dtype)
    return torch.arange(lo, hi + 1, dtype=torch.int32).to(dtype)


def table_lookup(q: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """y = table[q - dtype_min(q)] for 8-bit q and a table holding one entry per code."""
    lo, hi = dtype_range(q.dtype)
    if table.dim() != 1 or table.numel() != hi - lo + 1:
        raise NumericsError(f"a lookup table for {q.dtype} holds {hi - lo + 1} entries, got shape "
                            f"{tuple(table.shape)}")
    return table[q.to(torch.int64) - lo]


def clamp_range_for_activation(kind: str, scale: float, zero_point: int, qmin: int, qmax: int,
                               lo: float | None = None, hi: float | None = None) -> tuple[int, int]:
    """Integer output range after fusing relu / hardtanh / clamp(lo, hi) into requantization.
    Exact because quantize is monotone and maps 0 to zp: Q(relu(y)) == max(Q(y), zp)."""
    if kind == "relu":
        return max(qmin, zero_point), qmax
    q = lambda v: int(quantize(torch.tensor([v]), scale, zero_point, qmin, qmax, torch.int32)[0])
    return (q(lo) if lo is not None else qmin), (q(hi) if hi is not None else qmax)


# ---------------------------------------------------------------- per-token dynamic quantization
PER_TOKEN_BOUND = 127       # s_t = max|x| / 127: the row maximum lands on +-127, like the int8 weights
PER_TOKEN_QMIN = -128       # uint8 saturation; reached only with a subnormal (inexact) s_t
PER_TOKEN_ZERO_POINT = 128  # stored as uint8 q + 128: one value of [1, 255] per int8 level


PER_TOKEN_MIN_SCALE = 2.0 ** -149   # the smallest positive fp32: an all-zero row's scale


def per_token_scale(x: torch.Tensor) -> torch.Tensor:
    """s_t = max(fp32(max |x| over the last dim) / 127, 2^-149), shaped [..., 1]: never 0, so
    x / s_t is defined; a row whose scale would be 0 (all zeros, or max |x| <= 63.5 * 2^-149)
    quantizes to at most +-63 with the smallest positive scale. One Max node on an engine
    (replaced a `where(s == 0, 1, s)`: two nodes per activation, each a few us on small models).
    A row holding inf gets s_t = inf; one holding NaN is outside this contract (the compiled
    model's nan_policy covers such inputs)."""
    amax = x.to(torch.float32).abs().amax(dim=-1, keepdim=True)
    s = amax / torch.tensor(float(PER_TOKEN_BOUND), dtype=torch.float32)
    return torch.clamp_min(s, PER_TOKEN_MIN_SCALE)


def quantize_per_token(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q = clamp(RNE(x / s_t), -128, 127) + 128 as uint8 (scale broadcast along the last dim):
    uint8 saturation, as one standard QuantizeLinear(x, s_t, 128) computes it. With a normal s_t,
    |x / s_t| <= 127 + a few ulps, so the levels stay symmetric (+-127); only a subnormal s_t
    (max |x| < 127 * 2^-126), which is inexact, can reach -128 or saturate."""
    r = torch.round(x.to(torch.float32) / scale.to(torch.float32))
    r = torch.clamp(r, float(PER_TOKEN_QMIN), float(PER_TOKEN_BOUND))
    return (r + PER_TOKEN_ZERO_POINT).to(torch.uint8)


def dequantize_per_token(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x = fp32(int32(q) - 128) * s_t."""
    return (q.to(torch.int32) - PER_TOKEN_ZERO_POINT).to(torch.float32) * scale.to(torch.float32)


# ------------------------------------------------------ per-tensor dynamic quantization
DYNAMIC_QMIN, DYNAMIC_QMAX = 0, 255   # uint8, asymmetric (ONNX DynamicQuantizeLinear)


def dynamic_qparams(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, zp) of DynamicQuantizeLinear for the whole tensor x, as 0-d fp32 and uint8 tensors:
    the range [min x, max x] widened to hold 0, s = range / 255 (one fp32 division; 1 for an
    all-zero tensor), zp = the rounded, clamped code of 0. An empty x quantizes with s = 1,
    zp = 0. NaN is outside this contract (the compiled model's nan_policy covers such inputs)."""
    x32 = x.to(torch.float32)
    zero = torch.zeros((), dtype=torch.float32)
    lo = torch.minimum(x32.amin(), zero) if x32.numel() else zero
    hi = torch.maximum(x32.amax(), zero) if x32.numel() else zero
    if bool(hi == lo):
        return torch.ones((), dtype=torch.float32), torch.zeros((), dtype=torch.uint8)
    s = (hi - lo) / torch.tensor(float(DYNAMIC_QMAX - DYNAMIC_QMIN), dtype=torch.float32)
    zp = torch.round(torch.clamp(zero - lo / s, float(DYNAMIC_QMIN), float(DYNAMIC_QMAX)))
    return s, zp.to(torch.uint8)


def quantize_dynamic(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, s, zp): x quantized to uint8 with its own dynamic_qparams."""
    s, zp = dynamic_qparams(x)
    return quantize(x, s, zp, DYNAMIC_QMIN, DYNAMIC_QMAX, torch.uint8), s, zp


def dequantize_dynamic_accumulator(acc: torch.Tensor, scale: torch.Tensor, weight_scale,
                                   bias: torch.Tensor | None) -> torch.Tensor:
    """y = fp32(fp32(acc) * fp32(s * s_w)) (+ b): the scales' product per output column first,
    as an integer GEMM's float epilogue applies it (ONNX Runtime's MatMulIntegerToFloat /
    DynamicQuantizeMatMul: multiply, then add the bias, two roundings, no fused multiply-add)."""
    multiplier = scale.to(torch.float32) * _as_f32(weight_scale)
    y = acc.to(torch.float32) * multiplier
    return y if bias is None else y + bias.to(torch.float32)


def dequantize_per_token_accumulator(acc: torch.Tensor, token_scale: torch.Tensor, weight_scale) -> torch.Tensor:
    """y = fp32(fp32(fp32(acc) * s_w) * s_t): the per-channel weight scale first (what an integer
    GEMM's float epilogue applies per output column, e.g. ONNX Runtime's MatMulIntegerToFloat),
    then the per-row token scale. Two fp32 roundings, in this order, on every backend."""
    return (acc.to(torch.float32) * _as_f32(weight_scale)) * token_scale.to(torch.float32)


# Every integer of magnitude below 2^24 is an fp32 value: an engine that accumulates integer
# products in fp32 (OpenVINO's MatMulInteger) is exact while the accumulator stays below it.
EXACT_SUM = 2**24


def max_centered(dtype: torch.dtype, zp: int) -> int:
    """max |q - zp| over the codes of `dtype`."""
    lo, hi = dtype_range(dtype)
    return max(abs(lo - zp), abs(hi - zp))


# ---------------------------------------------------------------- weight-only (W4A16, W8A16)
WEIGHT_ONLY_BITS = (4, 8)
FP32_EPS = float(torch.finfo(torch.float32).eps)   # the smallest weight-only group scale


def weight_only_qmax(bits: int) -> int:
    """The largest code of b-bit unsigned weight codes: 2^b - 1."""
    if bits not in WEIGHT_ONLY_BITS:
        raise NumericsError(f"weight-only quantization takes 4 or 8 bits, got {bits}")
    return (1 << bits) - 1


def weight_groups(k: int, group_size: int) -> int:
    """Groups of one row of k input features: ceil(k / group_size)."""
    if group_size < 1:
        raise NumericsError(f"a weight group holds at least one value, got group_size={group_size}")
    return -(-k // group_size)


def _grouped(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N, K] -> [N, G, group_size], the last group padded with zeros (a zero changes neither a
    range that holds 0 nor a maximum magnitude)."""
    n, k = w.shape
    g = weight_groups(k, group_size)
    if g * group_size != k:
        w = torch.nn.functional.pad(w, (0, g * group_size - k))
    return w.reshape(n, g, group_size)


def weight_group_ranges(w: torch.Tensor, group_size: int, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) fp32 [N, G]: the range a group's codes span (module docstring): symmetric
    (-max |w|, max |w|), else (min(min w, 0), max(max w, 0))."""
    groups = _grouped(w.detach().to(torch.float32), group_size)
    if symmetric:
        amax = groups.abs().amax(-1)
        return -amax, amax
    zero = torch.zeros((), dtype=torch.float32)
    return torch.minimum(groups.amin(-1), zero), torch.maximum(groups.amax(-1), zero)


def clip_weight_groups(w: torch.Tensor, ratio: torch.Tensor, group_size: int,
                       amax: torch.Tensor | None = None) -> torch.Tensor:
    """w fp32 [N, K] with each group clamped to +-r * max |w| of the group, r = ratio [N, G] in
    (0, 1] (AWQ's weight clipping, quantize/awq.py); r = 1 leaves the group unchanged. `amax`:
    the groups' max |w| ([N, G], weight_group_ranges'), when the caller has it already."""
    if not bool(((ratio > 0) & (ratio <= 1)).all()):
        raise NumericsError("clip ratios must lie in (0, 1]")
    if amax is None:
        _, amax = weight_group_ranges(w, group_size, symmetric=True)
    bound = (amax * ratio.to(torch.float32)).unsqueeze(-1)
    return _ungrouped(torch.clamp(_grouped(w.detach().to(torch.float32), group_size), -bound, bound), w.shape[1])


def weight_only_qparams(w: torch.Tensor, bits: int, group_size: int,
                        symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale fp32 [N, G], zero point uint8 [N, G]) of a float weight [N, K] (module docstring)."""
    qmax = weight_only_qmax(bits)
    lo, hi = weight_group_ranges(w, group_size, symmetric)
    eps = torch.tensor(FP32_EPS, dtype=torch.float32)
    if symmetric:
        half = 1 << (bits - 1)
        scale = torch.maximum(hi / torch.tensor(float(half - 1), dtype=torch.float32), eps)
        return scale, torch.full_like(scale, half, dtype=torch.uint8)
    scale = torch.maximum((hi - lo) / torch.tensor(float(qmax), dtype=torch.float32), eps)
    zp = torch.clamp(torch.round(-lo / scale), 0, qmax)
    return scale, zp.to(torch.uint8)


def _ungrouped(t: torch.Tensor, k: int) -> torch.Tensor:
    """[N, G, group_size] -> [N, k]: `_grouped`'s inverse (the padding dropped)."""
    return t.reshape(t.shape[0], -1)[:, :k]


def pad_codes(codes: np.ndarray, zero_point: np.ndarray, width: int) -> np.ndarray:
    """Codes uint8 [N, K] widened to `width` columns with each row's last zero point: a code
    equal to its zero point dequantizes to exactly 0, so a kernel that takes whole groups or
    blocks (a last group shorter than the others) computes the same products."""
    n, k = codes.shape
    padded = np.empty((n, width), np.uint8)
    padded[:, :k] = codes
    padded[:, k:] = zero_point[:, -1:]
    return padded


def quantize_weight_groups(w: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, bits: int,
                           group_size: int) -> torch.Tensor:
    """Codes uint8 [N, K] = clamp(RNE(w / s) + zp, 0, 2^b - 1) with each group's (s, zp)."""
    q = quantize(_grouped(w, group_size), scale.unsqueeze(-1), zero_point.to(torch.int32).unsqueeze(-1),
                 0, weight_only_qmax(bits), torch.uint8)
    return _ungrouped(q, w.shape[1])


def dequantize_weight_groups(codes: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                             group_size: int) -> torch.Tensor:
    """w_fp = fp32(int32(u) - zp) * s, fp32 [N, K]."""
    w = dequantize(_grouped(codes, group_size), scale.to(torch.float32).unsqueeze(-1),
                   zero_point.to(torch.int32).unsqueeze(-1))
    return _ungrouped(w, codes.shape[1])


def fake_quantize_weight_groups(w: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, bits: int,
                                group_size: int) -> torch.Tensor:
    """dequantize_weight_groups(quantize_weight_groups(w, ...), ...) in one float pass (what an
    accuracy search evaluates many times): r = clamp(RNE(w / s), -zp, qmax - zp), NaN -> -zp
    (fmax/fmin return the number where one side is NaN), then r * s. Equal value for value:
    int32(code) - zp is r exactly (integers < 2^24), and + 0.0 turns RNE's -0.0 into the +0.0
    of the integer path. In place on one buffer: the search's time went to allocating."""
    s = scale.to(torch.float32).unsqueeze(-1)
    zp = zero_point.to(torch.float32).unsqueeze(-1)
    r = torch.div(_grouped(w.detach().to(torch.float32), group_size), s).round_()
    torch.fmax(r, -zp, out=r)
    torch.fmin(r, weight_only_qmax(bits) - zp, out=r)
    return _ungrouped(r.mul_(s).add_(0.0), w.shape[1])


def linear_weight_only(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                       bias: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """y = fp32 x @ w_fp^T (+ b): the weights dequantized, the matmul in fp32."""
    w = dequantize_weight_groups(codes, scale, zero_point, group_size)
    return torch.nn.functional.linear(x.to(torch.float32), w, None if bias is None else bias.to(torch.float32))


def embedding_weight_only(ids: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                          group_size: int) -> torch.Tensor:
    """Rows `ids` of a weight-only quantized table, dequantized: fp32 [..., K] (exact data
    movement and one rounding per value, on every engine)."""
    return dequantize_weight_groups(codes, scale, zero_point, group_size)[ids]


def reordered_sum_bound(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The largest |engine - reference| of fp32 x @ w^T when both sum the same fp32 products in
    different orders: each lies within gamma_K * (|x| @ |w|^T) of the exact sum (gamma_K =
    K*u / (1 - K*u), u = 2^-24; Higham, Accuracy and Stability, 3.1), so they differ by at most
    twice that (computed in float64; a product's own rounding and the bias's addition are covered
    by counting K + 1 operations over |x| @ |w|^T + |b|)."""
    k = w.shape[-1]
    u = 2.0 ** -24
    gamma = (k + 1) * u / (1 - (k + 1) * u)
    magnitude = torch.nn.functional.linear(x.to(torch.float64).abs(), w.to(torch.float64).abs(),
                                           None if bias is None else bias.to(torch.float64).abs())
    return 2 * gamma * magnitude
