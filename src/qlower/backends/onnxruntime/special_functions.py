"""Special functions for ONNX Runtime, written in ATen ops torchlib translates and evaluated in
float64: lgamma, digamma, the modified Bessel functions I0 / I1 (scaled and not),
spherical_bessel_j0, erf (series and continued fraction) and from it erfcx, log_ndtr, erfinv
and ndtri. torch's own decompositions of these end in `prims` ops torchlib has no translation
for (prims.lgamma, prims.bessel_i0, prims.erf_inv, ...), and torchlib's erfcx / log_ndtr
overflow. The series, fractions and Newton steps are ours, from their textbook definitions;
decompositions.py puts them in the exporter's table, tests/test_decompositions.py checks each
against eager over its whole range (poles, tails, ±inf, NaN).

torch.onnx writes every Python float as a float32 constant, also on float64 tensors (measured:
x · 2/√π off by 1.2e-7 at x = 2.0 in float64), so constants that are not float32 values are
split in two float32 halves (`_split`).
"""
from __future__ import annotations

import math

import numpy as np
import torch

A = torch.ops.aten


# Lanczos's approximation of the gamma function, g = 7 with 9 terms (the coefficients as
# tabulated by P. Godfrey): relative error ~1e-15, so float64 evaluation gives float32 results
# to the last bit or one off.
_LANCZOS_G = 7.0
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6,
            1.5056327351493116e-7)
# Bernoulli numbers B2k / 2k for digamma's asymptotic series, k = 1..5
_DIGAMMA_SERIES = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132)


def _in_float64(fn):
    """Evaluated in float64 (ONNX Runtime has float64 kernels for the arithmetic, Log, Sin and
    Cos, not Tan), the result in the input's float dtype (float32 for integer inputs, as eager)."""
    def decomposition(x):
        dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
        wide = x if x.dtype is torch.float64 else A._to_copy.default(x, dtype=torch.float64)
        y = fn(wide)
        return y if dtype is torch.float64 else A._to_copy.default(y, dtype=dtype)
    decomposition.__doc__ = fn.__doc__
    return decomposition


def _split(c: float) -> tuple[float, float]:
    """c as a float32 head and a float32 tail (together ~48 bits): torch.onnx writes every
    Python float of a Scalar op or a `full` as a float32 constant, also on float64 tensors
    (measured: x · 2/√π off by 1.2e-7 with x = 2.0 in float64), which cost erfcx near 2.5 a
    relative 1.2e-4 through 1 - erf(x). Each half is exact in float32."""
    head = _to_float32(c)   # (not torch.tensor: decompositions run under fake tensors)
    if abs(head) > abs(c):   # rounded toward zero, so the tail has c's sign: inf·head + inf·tail is inf
        head = float(np.nextafter(np.float32(head), np.float32(0)))
    return head, _to_float32(c - head)


def _to_float32(c: float) -> float:
    return float(np.float32(c))


def _times(x, c: float):
    """x · c to float64 precision (see _split)."""
    head, tail = _split(c)
    return A.mul.Scalar(x, head) if tail == 0 else A.add.Tensor(A.mul.Scalar(x, head), A.mul.Scalar(x, tail))


def _plus(x, c: float):
    """x + c to float64 precision (see _split)."""
    head, tail = _split(c)
    return A.add.Scalar(x, head) if tail == 0 else A.add.Scalar(A.add.Scalar(x, head), tail)


def _filled(like, c: float):
    """A tensor like `like`, filled with c to float64 precision (see _split)."""
    head, tail = _split(c)
    full = A.full_like.default(like, head)
    return full if tail == 0 else A.add.Scalar(full, tail)


def _fraction(x):
    """x minus its nearest integer, in [-1/2, 1/2]: exact in float64 for a float32 x (tiny x
    stay tiny), so sin(pi·x) and cos(pi·x) keep their values up to sign for large |x| too."""
    return A.sub.Tensor(x, A.round.default(x))


def _is_pole(x):
    """0, -1, -2, ...: where gamma has its poles."""
    return A.logical_and.default(A.le.Scalar(x, 0), A.eq.Tensor(x, A.floor.default(x)))


def _lgamma_from_half(x):
    """log|Γ(x)| for x >= 0.5 by Lanczos's series."""
    z = A.sub.Scalar(x, 1)
    a = _filled(z, _LANCZOS[0])
    for i, c in enumerate(_LANCZOS[1:], start=1):
        a = A.add.Tensor(a, A.div.Tensor(_filled(z, c), A.add.Scalar(z, i)))
    t = A.add.Scalar(z, _LANCZOS_G + 0.5)
    main = A.sub.Tensor(A.mul.Tensor(A.add.Scalar(z, 0.5), A.log.default(t)), t)
    return A.add.Tensor(_plus(main, 0.5 * math.log(2 * math.pi)), A.log.default(a))


@_in_float64
def lgamma(x):
    """log|Γ(x)|: Lanczos's series from 1/2 up, below that the reflection formula
    log(pi / |sin(pi·x)|) - log|Γ(1 - x)|; +inf at the poles and at ±inf, as eager.
    torch's own decomposition reaches prims.lgamma, which torchlib does not translate."""
    reflected = A.lt.Scalar(x, 0.5)
    body = _lgamma_from_half(A.where.self(reflected, A.rsub.Scalar(x, 1), x))
    sine = A.abs.default(A.sin.default(_times(_fraction(x), math.pi)))
    mirror = A.sub.Tensor(A.log.default(A.div.Tensor(_filled(x, math.pi), sine)), body)
    y = A.where.self(reflected, mirror, body)
    infinite = A.logical_or.default(_is_pole(x), A.isinf.default(x))
    return A.where.self(infinite, A.full_like.default(x, math.inf), y)


def _digamma_from_zero(y):
    """ψ(y) for y > 0: six steps of ψ(y) = ψ(y + 1) - 1/y, then the asymptotic series at y + 6."""
    shift = A.zeros_like.default(y)
    for k in range(6):
        shift = A.add.Tensor(shift, A.reciprocal.default(A.add.Scalar(y, k)))
    w = A.add.Scalar(y, 6)
    inverse_square = A.reciprocal.default(A.mul.Tensor(w, w))
    series, power = A.zeros_like.default(w), inverse_square
    for c in _DIGAMMA_SERIES:
        series = A.add.Tensor(series, _times(power, c))
        power = A.mul.Tensor(power, inverse_square)
    psi = A.sub.Tensor(A.sub.Tensor(A.log.default(w), A.div.Tensor(A.full_like.default(w, 0.5), w)), series)
    return A.sub.Tensor(psi, shift)


@_in_float64
def digamma(x):
    """ψ(x): shifted asymptotic series for x > 0, the reflection ψ(1 - x) - pi / tan(pi·x)
    below; at 0 -1/x (-inf for +0.0, +inf for -0.0), NaN at the negative integers, as eager.
    torch's own decomposition reaches prims.digamma, which torchlib does not translate."""
    reflected = A.lt.Scalar(x, 0)
    body = _digamma_from_zero(A.where.self(reflected, A.rsub.Scalar(x, 1), x))
    angle = _times(_fraction(x), math.pi)   # pi / tan as pi·cos / sin: ORT has no float64 Tan kernel
    cotangent = A.div.Tensor(_times(A.cos.default(angle), math.pi), A.sin.default(angle))
    mirror = A.sub.Tensor(body, cotangent)
    y = A.where.self(reflected, mirror, body)
    y = A.where.self(_is_pole(x), A.full_like.default(x, math.nan), y)
    return A.where.self(A.eq.Scalar(x, 0), A.div.Tensor(A.full_like.default(x, -1.0), x), y)


# Modified Bessel functions I0, I1: the power series below the crossover, the asymptotic
# expansion above it (both summed in float64; at |x| = 15 the 36-term series and the 25-term
# expansion are both within ~1e-12 relative, far below float32's 6e-8).
_BESSEL_CROSSOVER, _BESSEL_SERIES_TERMS, _BESSEL_ASYMPTOTIC_TERMS = 15.0, 36, 25


def _bessel_i_scaled(ax, order: int):
    """e^-x · I_order(x) for x = |input| >= 0, in float64."""
    q = A.mul.Scalar(A.mul.Tensor(ax, ax), 0.25)
    term = A.ones_like.default(ax) if order == 0 else A.mul.Scalar(ax, 0.5)
    series = term
    for k in range(_BESSEL_SERIES_TERMS):
        term = A.div.Scalar(A.mul.Tensor(term, q), (k + 1) * (k + 1 + order))
        series = A.add.Tensor(series, term)
    coefficient, inverse = 1.0, A.reciprocal.default(ax)
    expansion, power = A.ones_like.default(ax), A.ones_like.default(ax)
    for k in range(1, _BESSEL_ASYMPTOTIC_TERMS):
        coefficient *= -(4 * order * order - (2 * k - 1) ** 2) / (8 * k)
        power = A.mul.Tensor(power, inverse)
        expansion = A.add.Tensor(expansion, _times(power, coefficient))
    asymptotic = A.div.Tensor(expansion, A.sqrt.default(_times(ax, 2 * math.pi)))
    small = A.mul.Tensor(series, A.exp.default(A.neg.default(ax)))
    return A.where.self(A.gt.Scalar(ax, _BESSEL_CROSSOVER), asymptotic, small)


def bessel_i(order: int, scaled: bool):
    def decomposition(x):
        """Modified Bessel function of the first kind (I0 or I1, or e^-|x| times it), in float64.
        The unscaled ones are inf wherever e^|x| overflows the input's dtype, NaN at ±inf, as
        eager (whose float32 kernels multiply by a float32 exp(x) first). torch's own
        decompositions reach prims.bessel_i0 and relatives, which torchlib does not translate."""
        dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
        x = x if x.dtype == dtype else A._to_copy.default(x, dtype=dtype)
        wide = A._to_copy.default(x, dtype=torch.float64)
        ax = A.abs.default(wide)
        y = _bessel_i_scaled(ax, order)
        if not scaled:
            y = A.mul.Tensor(y, A.exp.default(ax))
        if order == 1:
            y = A.mul.Tensor(y, A.sign.default(wide))
        y = A._to_copy.default(y, dtype=dtype)
        if scaled:
            return y
        overflow = A.logical_and.default(A.isfinite.default(x), A.isinf.default(A.exp.default(A.abs.default(x))))
        infinity = A.full_like.default(y, math.inf)
        return A.where.self(overflow, infinity if order == 0 else A.mul.Tensor(infinity, A.sign.default(x)), y)
    return decomposition


@_in_float64
def spherical_bessel_j0(x):
    """sin(x) / x, 1 at 0 and 0 at ±inf, as eager; float64 keeps tiny x exact."""
    y = A.div.Tensor(A.sin.default(x), x)
    y = A.where.self(A.eq.Scalar(x, 0), A.ones_like.default(x), y)
    return A.where.self(A.isinf.default(x), A.zeros_like.default(x), y)


# The error function in float64, ours: below |x| = 2.5 the series erf(x) = 2x·e^(-x²)/√π ·
# Σ (2x²)^n / (1·3···(2n+1)) (positive terms, 36 of them), above it erfc's continued fraction
# erfcx(x) = 1 / (√π (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...))))) to depth 30. Both are
# within 3e-12 relative of math.erf / math.erfc over their ranges (measured), so the float32
# results below round as eager's do (1e-4 is the OpInfo tolerance; the tests ask 1e-5).
_ERF_SPLIT, _ERF_TERMS, _ERFC_DEPTH = 2.5, 36, 30
_SQRT_PI = math.sqrt(math.pi)


def _erf_series(x):
    """erf(x) for |x| < 2.5 (float64)."""
    x2 = A.mul.Tensor(x, x)
    term, total = x, x
    for n in range(_ERF_TERMS):
        term = A.div.Scalar(A.mul.Tensor(term, A.mul.Scalar(x2, 2.0)), 2 * n + 3)
        total = A.add.Tensor(total, term)
    return A.mul.Tensor(_times(total, 2 / _SQRT_PI), A.exp.default(A.neg.default(x2)))


def _erfcx_fraction(x):
    """erfcx(x) = e^(x²)·erfc(x) for x >= 2.5 (float64), from the continued fraction."""
    t = x
    for k in range(_ERFC_DEPTH, 0, -1):
        t = A.add.Tensor(x, A.div.Tensor(A.full_like.default(x, k / 2), t))
    return A.reciprocal.default(_times(t, _SQRT_PI))


def _erfcx_positive(x):
    """erfcx for x >= 0 (float64): the fraction from 2.5 up, e^(x²)(1 - erf(x)) below."""
    middle = A.mul.Tensor(A.exp.default(A.mul.Tensor(x, x)), A.rsub.Scalar(_erf_series(x), 1))
    return A.where.self(A.ge.Scalar(x, _ERF_SPLIT), _erfcx_fraction(x), middle)


def _erfcx_wide(x):
    """erfcx over the whole line (float64): the fraction from 2.5 up, e^(x²)(1 - erf(x)) between,
    2e^(x²) - erfcx(-x) below -2.5."""
    square = A.exp.default(A.mul.Tensor(x, x))
    far = _erfcx_fraction(A.abs.default(x))
    middle = A.mul.Tensor(square, A.rsub.Scalar(_erf_series(x), 1))
    below = A.sub.Tensor(A.mul.Scalar(square, 2.0), far)
    return A.where.self(A.ge.Scalar(x, _ERF_SPLIT), far, A.where.self(A.le.Scalar(x, -_ERF_SPLIT), below, middle))


@_in_float64
def erfcx(x):
    """erfcx(x) = e^(x²)·erfc(x) without overflow for large x (0 at +inf, inf at -inf).
    torchlib's translation computes e^(x²) first (it overflowed: the measured gap this
    replaces)."""
    return _erfcx_wide(x)


def _log1p_of_small(q):
    """log(1 - q) for 0 <= q <= 2e-4 (float64): -q - q²/2 - q³/3 - q⁴/4, below 1e-19 off."""
    return A.neg.default(A.add.Tensor(q, A.mul.Tensor(A.mul.Tensor(q, q),
                         A.add.Scalar(A.mul.Tensor(q, A.add.Scalar(A.mul.Scalar(q, 0.25), 1 / 3)), 0.5))))


@_in_float64
def log_ndtr(x):
    """log Φ(x), Φ(x) = erfc(-x/√2) / 2: the fraction for x <= -3.54 (log(erfcx(t)/2) - t², no
    underflow), log1p of the small tail for x >= 3.54, the series between; 0 at +inf, -inf at
    -inf. torchlib's translation took the log of an underflowed Φ (the measured gap this replaces)."""
    t = _times(x, -1 / math.sqrt(2))
    low = A.sub.Tensor(A.log.default(A.mul.Scalar(_erfcx_fraction(t), 0.5)), A.mul.Tensor(t, t))
    neg_t = A.neg.default(t)
    q = A.mul.Scalar(A.mul.Tensor(A.exp.default(A.neg.default(A.mul.Tensor(t, t))), _erfcx_fraction(neg_t)), 0.5)
    high = _log1p_of_small(q)
    middle = A.log.default(A.mul.Scalar(A.rsub.Scalar(_erf_series(t), 1), 0.5))
    return A.where.self(A.ge.Scalar(t, _ERF_SPLIT), low, A.where.self(A.le.Scalar(t, -_ERF_SPLIT), high, middle))


_ERFINV_STEPS, _ERFCINV_STEPS = 2, 3   # from starts within 2e-3 (middle) and 2e-2 (tail): quadratic
_ERFINV_TAIL = 0.9   # |y| above: Newton on log erfc, which keeps its precision where erf(x) -> 1


def _winitzki(y):
    """Winitzki's closed-form approximation of erfinv (relative error < 2e-3), Newton's start."""
    a = 0.147
    ln = A.log.default(A.rsub.Scalar(A.mul.Tensor(y, y), 1))
    b = A.add.Scalar(A.mul.Scalar(ln, 0.5), 2 / (math.pi * a))
    inner = A.sub.Tensor(A.sqrt.default(A.sub.Tensor(A.mul.Tensor(b, b), A.div.Scalar(ln, a))), b)
    return A.mul.Tensor(A.sign.default(y), A.sqrt.default(inner))


def _erfinv_central(y):
    """erfinv(y) for |y| <= 0.9 (float64): Newton on erf(x) - y."""
    x = _winitzki(y)
    for _ in range(_ERFINV_STEPS):
        step = A.mul.Tensor(A.sub.Tensor(_erf_series(x), y), A.exp.default(A.mul.Tensor(x, x)))
        x = A.sub.Tensor(x, _times(step, _SQRT_PI / 2))
    return x


def _erfcinv_tail(z):
    """x > 0 with erfc(x) = z, for 0 < z <= 0.1 (float64): Newton on log erfc(x) - log z, whose
    derivative is -2 / (√π·erfcx(x)), from erfc's asymptote x² = -log z - log(x√π) (1 - z
    rounds to 1 for tiny z, which Winitzki's form cannot take)."""
    target = A.log.default(z)
    start = A.sqrt.default(A.neg.default(target))
    x = A.sqrt.default(A.sub.Tensor(A.neg.default(target), A.log.default(_times(start, _SQRT_PI))))
    for _ in range(_ERFCINV_STEPS):
        scaled = _erfcx_positive(x)
        gap = A.sub.Tensor(A.sub.Tensor(A.log.default(scaled), A.mul.Tensor(x, x)), target)
        x = A.add.Tensor(x, _times(A.mul.Tensor(gap, scaled), _SQRT_PI / 2))
    return x


def _domain_edges(p, low: float, high: float, value, at_low: float, at_high: float):
    """value inside (low, high), at_low / at_high at its ends, NaN outside it (and for NaN)."""
    y = A.where.self(A.eq.Scalar(p, low), A.full_like.default(p, at_low), value)
    y = A.where.self(A.eq.Scalar(p, high), A.full_like.default(p, at_high), y)
    inside = A.logical_and.default(A.ge.Scalar(p, low), A.le.Scalar(p, high))
    return A.where.self(inside, y, A.full_like.default(p, math.nan))


@_in_float64
def erfinv(y):
    """erfinv: Newton from Winitzki's approximation, on erf in the middle and on log erfc in the
    tails (1 - |y| is exact in float64 for a float32 y); ±inf at ±1, NaN outside. torch's own
    decomposition reaches prims.erf_inv."""
    magnitude = A.abs.default(y)
    tail = A.mul.Tensor(A.sign.default(y), _erfcinv_tail(A.rsub.Scalar(magnitude, 1)))
    x = A.where.self(A.gt.Scalar(magnitude, _ERFINV_TAIL), tail, _erfinv_central(y))
    return _domain_edges(y, -1.0, 1.0, x, -math.inf, math.inf)


@_in_float64
def ndtri(p):
    """Φ⁻¹(p) = -√2·erfcinv(2p): erfinv(2p - 1) in the middle, the erfc tail for p near 0
    (2p exact) and near 1 (2(1 - p) exact); ∓inf at 0 and 1, NaN outside. torch's own
    decomposition reaches prims.ndtri."""
    middle = _times(_erfinv_central(A.sub.Scalar(A.mul.Scalar(p, 2.0), 1)), math.sqrt(2))
    upper = A.gt.Scalar(p, 0.5)   # one tail for both ends: z = 2·min(p, 1 - p), exact
    z = A.mul.Scalar(A.where.self(upper, A.rsub.Scalar(p, 1), p), 2.0)
    tail = A.mul.Tensor(_times(_erfcinv_tail(z), math.sqrt(2)), A.sub.Scalar(A.mul.Scalar(
        A._to_copy.default(upper, dtype=p.dtype), 2.0), 1))
    x = A.where.self(A.lt.Scalar(z, 1 - _ERFINV_TAIL), tail, middle)
    return _domain_edges(p, 0.0, 1.0, x, -math.inf, math.inf)
