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


# The Hurwitz zeta function ζ(s, q) = Σ_k (q + k)^-s, the way eager sums it (in float64 for
# float32 inputs): ten terms directly, then the Euler–Maclaurin tail at w = q + 10 >= 10 with
# twelve Bernoulli terms (relative error below 1e-16 for the orders polygamma asks, measured
# against mpmath). Where the direct terms have already converged (large s) the tail is left
# out, as eager's early exit does: its rising factorials would overflow there.
_ZETA_DIRECT = 10
_BERNOULLI_OVER_FACTORIAL = tuple(b / math.factorial(2 * j) for j, b in enumerate(
    (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510, 43867 / 798,
     -174611 / 330, 854513 / 138, -236364091 / 2730), start=1))


def _zeta_of_positive(s, q):
    """ζ(s, q) for s > 1, q > 0 (float64)."""
    direct = A.zeros_like.default(A.add.Tensor(s, q))
    term = direct
    for k in range(_ZETA_DIRECT):
        term = A.pow.Tensor_Tensor(A.add.Scalar(q, k), A.neg.default(s))
        direct = A.add.Tensor(direct, term)
    w = A.add.Scalar(q, _ZETA_DIRECT)
    power = A.pow.Tensor_Tensor(w, A.neg.default(s))   # w^-s
    tail = A.add.Tensor(A.div.Tensor(A.mul.Tensor(power, w), A.sub.Scalar(s, 1)), A.mul.Scalar(power, 0.5))
    rising = A.div.Tensor(A.mul.Tensor(power, s), w)   # s·w^(-s-1), then (s)_(2j-1)·w^(-s-2j+1)
    inverse_square = A.reciprocal.default(A.mul.Tensor(w, w))
    for j, c in enumerate(_BERNOULLI_OVER_FACTORIAL):
        tail = A.add.Tensor(tail, _times(rising, c))
        grow = A.mul.Tensor(A.add.Scalar(s, 2 * j + 1), A.add.Scalar(s, 2 * j + 2))
        rising = A.mul.Tensor(rising, A.mul.Tensor(grow, inverse_square))
    converged = A.lt.Tensor(A.abs.default(term), A.mul.Scalar(A.abs.default(direct), 1e-17))
    return A.where.self(converged, direct, A.add.Tensor(direct, tail))


def _is_integer(x):
    return A.eq.Tensor(x, A.floor.default(x))


def _hurwitz_zeta(s, q):
    """ζ(s, q) with eager's (Cephes') domain, float64: inf at s = 1 and at q = 0, -1, -2, ...;
    NaN for s < 1, for a negative non-integer q with a non-integer s, and at q = +inf. A
    negative q (integer s) by the reflection of its negative terms, f = q - floor(q) in (0, 1):
      ζ(s, q) = [f^-s + (-1)^s (1 - f)^-s] + ζ(s, 1 + f) + (-1)^s [ζ(s, 2 - f) - ζ(s, 1 - q)],
    every evaluation at a positive argument (eager sums from q up, one term a step), the two
    largest terms side by side so that they cancel exactly where eager's do (f = 1/2, odd s)."""
    s, q = A.add.Tensor(s, A.zeros_like.default(q)), A.add.Tensor(q, A.zeros_like.default(s))
    negative = A.lt.Scalar(q, 0)
    one = A.ones_like.default(q)
    f = A.sub.Tensor(q, A.floor.default(q))
    f = A.where.self(A.logical_and.default(negative, A.gt.Scalar(f, 0)), f, A.full_like.default(q, 0.5))
    sign = A.rsub.Scalar(A.mul.Scalar(A.sub.Tensor(s, A.mul.Scalar(A.floor.default(A.mul.Scalar(s, 0.5)), 2.0)), 2.0), 1)
    minus_s = A.neg.default(s)
    leading = A.add.Tensor(A.pow.Tensor_Tensor(f, minus_s), A.mul.Tensor(sign, A.pow.Tensor_Tensor(A.rsub.Scalar(f, 1), minus_s)))
    # the four evaluations as one (stacked): a quarter of the graph
    arguments = [A.where.self(negative, one, q), A.add.Scalar(f, 1), A.rsub.Scalar(f, 2),
                 A.where.self(negative, A.rsub.Scalar(q, 1), one)]
    plain, first, second, far = A.unbind.int(_zeta_of_positive(A.stack.default([s] * 4), A.stack.default(arguments)))
    reflected = A.add.Tensor(leading, A.add.Tensor(first, A.mul.Tensor(sign, A.sub.Tensor(second, far))))
    y = A.where.self(negative, reflected, plain)
    return _zeta_domain(s, q, y)


def _zeta_domain(s, q, y):
    """Eager's values where ζ(s, q) has a pole or is not defined (see _hurwitz_zeta)."""
    nan, inf = A.full_like.default(y, math.nan), A.full_like.default(y, math.inf)
    y = A.where.self(A.isinf.default(s), _zeta_of_infinite_order(q), y)
    y = A.where.self(A.logical_and.default(A.lt.Scalar(q, 0), A.logical_not.default(_is_integer(s))), nan, y)
    y = A.where.self(A.eq.Scalar(q, math.inf), nan, y)
    y = A.where.self(A.logical_and.default(A.le.Scalar(q, 0), _is_integer(q)), inf, y)
    y = A.where.self(A.lt.Scalar(s, 1), nan, y)
    return A.where.self(A.eq.Scalar(s, 1), inf, y)


def _zeta_of_infinite_order(q):
    """ζ(+inf, q) as eager's summation ends: 1 at q = 1, inf where some |q + k| < 1 (0 < q < 1, or
    q negative), NaN beyond 1 (every term 0, the tail 0·inf)."""
    inf = A.full_like.default(q, math.inf)
    y = A.where.self(A.eq.Scalar(q, 1), A.ones_like.default(q), A.full_like.default(q, math.nan))
    return A.where.self(A.lt.Scalar(q, 1), inf, y)


def _float_result(*xs):
    """The result dtype of an elementwise float function of xs (integers promote to float32)."""
    dtype = xs[0].dtype if len(xs) == 1 else torch.result_type(*xs)
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


def _wide(x):
    if not isinstance(x, torch.Tensor):
        return x
    return x if x.dtype is torch.float64 else A._to_copy.default(x, dtype=torch.float64)


def zeta(x, q):
    """special.zeta(x, q): the Hurwitz zeta function in float64, eager's domain (above). torch's
    own decomposition reaches prims.zeta, which torchlib does not translate."""
    dtype = _float_result(x, q)
    like = x if isinstance(x, torch.Tensor) else q
    s = _wide(x) if isinstance(x, torch.Tensor) else _filled(A._to_copy.default(like, dtype=torch.float64), x)
    q = _wide(q) if isinstance(q, torch.Tensor) else _filled(s, q)
    y = _hurwitz_zeta(s, q)
    return y if dtype is torch.float64 else A._to_copy.default(y, dtype=dtype)


def _cotangent_derivative(n: int) -> tuple[float, ...]:
    """Coefficients (in powers of c = cot(πx)) of dⁿ/dxⁿ cot(πx): d/dx c = -π(1 + c²)."""
    p = [0.0, 1.0]
    for _ in range(n):
        d = [k * p[k] for k in range(1, len(p))] + [0.0, 0.0]   # p'(c), then times -π(1 + c²)
        p = [-math.pi * (d[k] + (d[k - 2] if k >= 2 else 0.0)) for k in range(len(d))]
    return tuple(p)


def _polygamma_of_positive(n: int, x):
    """ψ⁽ⁿ⁾(x) = (-1)^(n+1) n! ζ(n + 1, x) for x > 0 (float64)."""
    return _times(_zeta_of_positive(A.full_like.default(x, float(n + 1)), x), (-1) ** (n + 1) * math.factorial(n))


def polygamma(n: int, x):
    """ψ⁽ⁿ⁾(x) for n >= 1 in float64: ζ(n + 1, x) for x > 0, below it the reflection
    ψ⁽ⁿ⁾(x) = (-1)ⁿ ψ⁽ⁿ⁾(1 - x) - π dⁿ/dxⁿ cot(πx) (exact where the terms cancel, x far below 0);
    ±inf at 0 and the negative integers, NaN at -inf for n = 1 and at +inf for n >= 2 (eager's
    trigamma and zeta). Eager's own trigamma (n = 1) reflects in float32 (sinf(π_f·x)), which
    gives large finite values at the negative integers (1.3e15 at -1) and loses digits for large
    negative x (3 % at -1e6 + 1/2); here the poles are inf and the reflection exact
    (docs/coverage.md). torch's own decomposition reaches prims.zeta."""
    dtype = _float_result(x)
    x = _wide(x)
    reflected = A.lt.Scalar(x, 0)
    body = _polygamma_of_positive(n, A.where.self(reflected, A.rsub.Scalar(x, 1), A.where.self(
        A.eq.Scalar(x, 0), A.ones_like.default(x), x)))
    f = _fraction(x)   # cot(πf) as sin(π(1/2 - |f|)) / sin(πf): 0 exactly at the half-integers
    c = A.div.Tensor(A.sin.default(_times(A.rsub.Scalar(A.abs.default(f), 0.5), math.pi)),
                     A.sin.default(_times(f, math.pi)))
    derivative = A.zeros_like.default(c)
    for coefficient in reversed(_cotangent_derivative(n)):
        derivative = _plus_times(A.mul.Tensor(derivative, c), A.ones_like.default(c), coefficient)
    mirror = A.sub.Tensor(A.mul.Scalar(body, (-1) ** n), _times(derivative, math.pi))
    y = A.where.self(reflected, mirror, body)
    pole = A.full_like.default(y, math.inf if n % 2 else -math.inf)
    y = A.where.self(_is_pole(x), pole, y)
    if n == 1:   # trigamma: 0 at +inf (its series), NaN at -inf (sin(-inf))
        y = A.where.self(A.eq.Scalar(x, math.inf), A.zeros_like.default(y), y)
        y = A.where.self(A.eq.Scalar(x, -math.inf), A.full_like.default(y, math.nan), y)
    else:    # zeta: NaN at +inf (0·inf in its tail), a pole at -inf
        y = A.where.self(A.eq.Scalar(x, math.inf), A.full_like.default(y, math.nan), y)
        y = A.where.self(A.eq.Scalar(x, -math.inf), pole, y)
    return y if dtype is torch.float64 else A._to_copy.default(y, dtype=dtype)


def _plus_times(x, unit, c: float):
    """x + c·unit to float64 precision (see _split)."""
    return A.add.Tensor(x, _times(unit, c)) if c else x


# Bessel functions J0, J1, Y0, Y1 of real x: power series below |x| = 20, Hankel's asymptotic
# expansion above it (42 series terms, whose largest is 7.6e6 at x = 20: ~1e-9 absolute; 20
# expansion terms, the 20th ~4e-16 relative at x = 20; measured against mpmath). The modified
# K0, K1: series up to x = 2, the trapezoidal rule on e^x·K_ν(x) = ∫ e^(-x(cosh t - 1))
# cosh(νt) dt up to 20 (exponentially convergent: 41 nodes, h = 0.1), the asymptotic
# expansion beyond.
_HANKEL_CROSSOVER, _BESSEL_J_TERMS, _HANKEL_TERMS = 20.0, 42, 20
_K_SERIES_END, _K_NODES, _K_STEP = 2.0, 41, 0.1
_EULER_GAMMA = 0.5772156649015329


def _hankel_series(x, order: int):
    """(P, Q) of Hankel's expansion for J/Y of this order at x >= 20 (float64)."""
    mu = 4.0 * order * order
    coefficients, a = [], 1.0
    for k in range(1, _HANKEL_TERMS):
        a *= (mu - (2 * k - 1) ** 2) / (8 * k)
        coefficients.append(a)
    return _oscillating_halves(A.reciprocal.default(x), coefficients)


def _oscillating_halves(t, coefficients):
    """(1 - c2 t² + c4 t⁴ - ..., c1 t - c3 t³ + ...) for coefficients c1, c2, ...: the two halves
    of an oscillating asymptotic expansion (Hankel's P and Q, Airy's) in float64."""
    even, odd, power = A.ones_like.default(t), A.zeros_like.default(t), A.ones_like.default(t)
    for k, c in enumerate(coefficients, start=1):
        power = A.mul.Tensor(power, t)
        term = _times(power, c if (k // 2) % 2 == 0 else -c)
        if k % 2:
            odd = A.add.Tensor(odd, term)
        else:
            even = A.add.Tensor(even, term)
    return even, odd


def _hankel(x, order: int, second_kind: bool):
    """J or Y of order 0/1 for x >= 20: √(2/(πx)) (P cos χ - Q sin χ) (J) or (P sin χ + Q cos χ)
    (Y), χ = x - (2·order + 1)π/4, with cos χ and sin χ from sin x and cos x of the exact x."""
    p, q = _hankel_series(x, order)
    s, c = A.sin.default(x), A.cos.default(x)
    if order == 0:   # χ = x - π/4
        cos_chi, sin_chi = A.add.Tensor(c, s), A.sub.Tensor(s, c)
    else:            # χ = x - 3π/4
        cos_chi, sin_chi = A.sub.Tensor(s, c), A.neg.default(A.add.Tensor(s, c))
    if second_kind:
        value = A.add.Tensor(A.mul.Tensor(p, sin_chi), A.mul.Tensor(q, cos_chi))
    else:
        value = A.sub.Tensor(A.mul.Tensor(p, cos_chi), A.mul.Tensor(q, sin_chi))
    # √(2/(πx)) · (1/√2) from cos χ = (c ± s)/√2
    return A.mul.Tensor(value, A.rsqrt.default(_times(x, math.pi)))


def _bessel_j_series(x, order: int):
    """J0(x), or J1(x)/x, from Σ (-1)^k (x/2)^(2k) / (k! (k+order)! 2^order) (float64)."""
    q = A.mul.Scalar(A.mul.Tensor(x, x), -0.25)
    term = A.ones_like.default(x) if order == 0 else A.full_like.default(x, 0.5)
    total = term
    for k in range(1, _BESSEL_J_TERMS):
        term = A.div.Scalar(A.mul.Tensor(term, q), k * (k + order))
        total = A.add.Tensor(total, term)
    return total


def _harmonic(k: int) -> float:
    return math.fsum(1.0 / j for j in range(1, k + 1))


def _bessel_y_series(x, order: int, j):
    """Y0 / Y1 below the crossover from their series (x > 0, float64); j is J_order(x)."""
    log_half = A.log.default(A.mul.Scalar(x, 0.5))
    q = A.mul.Scalar(A.mul.Tensor(x, x), -0.25)
    if order == 0:   # (2/π) [(log(x/2) + γ) J0 + Σ_{k>=1} (-1)^(k+1) H_k (x²/4)^k / (k!)²]
        power, total = A.ones_like.default(x), A.zeros_like.default(x)
        for k in range(1, _BESSEL_J_TERMS):
            power = A.div.Scalar(A.mul.Tensor(power, q), k * k)
            total = A.sub.Tensor(total, _times(power, _harmonic(k)))
        value = A.add.Tensor(A.mul.Tensor(_plus(log_half, _EULER_GAMMA), j), total)
        return _times(value, 2 / math.pi)
    # -2/(πx) + (2/π) log(x/2) J1 - (1/π) Σ_{k>=0} (-1)^k (H_k + H_{k+1} - 2γ) (x/2)^(2k+1) / (k!(k+1)!)
    power, total = A.mul.Scalar(x, 0.5), A.zeros_like.default(x)
    for k in range(_BESSEL_J_TERMS):
        if k:
            power = A.div.Scalar(A.mul.Tensor(power, q), k * (k + 1))
        total = A.add.Tensor(total, _times(power, _harmonic(k) + _harmonic(k + 1) - 2 * _EULER_GAMMA))
    value = A.sub.Tensor(A.mul.Scalar(A.mul.Tensor(log_half, j), 2.0), total)
    return A.sub.Tensor(_times(value, 1 / math.pi), _times(A.reciprocal.default(x), 2 / math.pi))


def _bessel_jy(order: int, second_kind: bool):
    def decomposition(x):
        """Bessel function of the first (J) or second (Y) kind, float64 inside: series below
        |x| = 20, Hankel's expansion above. J1 is odd (J1(-0.0) = -0.0); Y is NaN below 0 and
        -inf at ±0; all are NaN at ±inf, as eager. torch's own decompositions reach
        prims.bessel_j0 / j1 (Y has none)."""
        dtype = _float_result(x)
        wide = _wide(x)
        ax = A.abs.default(wide)
        far = A.gt.Scalar(ax, _HANKEL_CROSSOVER)
        near_x = A.where.self(far, A.ones_like.default(wide), wide if order == 1 and not second_kind else ax)
        far_x = A.where.self(far, ax, A.full_like.default(ax, _HANKEL_CROSSOVER + 1))
        j = _bessel_j_series(near_x, order)
        if order == 1:
            j = A.mul.Tensor(j, near_x)   # J1(x) = x · (J1(x)/x): odd, and -0.0 at -0.0
        near = _bessel_y_series(near_x, order, j) if second_kind else j
        hankel = _hankel(far_x, order, second_kind)
        if order == 1 and not second_kind:
            hankel = A.where.self(A.lt.Scalar(wide, 0), A.neg.default(hankel), hankel)
        y = A.where.self(far, hankel, near)
        if second_kind:
            y = A.where.self(A.eq.Scalar(wide, 0), A.full_like.default(y, -math.inf), y)
            y = A.where.self(A.lt.Scalar(wide, 0), A.full_like.default(y, math.nan), y)
        y = A.where.self(A.isinf.default(wide), A.full_like.default(y, math.nan), y)
        return y if dtype is torch.float64 else A._to_copy.default(y, dtype=dtype)
    return decomposition


bessel_j0, bessel_j1 = _bessel_jy(0, second_kind=False), _bessel_jy(1, second_kind=False)
bessel_y0, bessel_y1 = _bessel_jy(0, second_kind=True), _bessel_jy(1, second_kind=True)


def _bessel_k_series(x, order: int):
    """K0 / K1 for 0 < x <= 2 from their series (float64), with I0 / I1 from _bessel_i_scaled."""
    log_half = A.log.default(A.mul.Scalar(x, 0.5))
    i = A.mul.Tensor(_bessel_i_scaled(x, order), A.exp.default(x))
    q = A.mul.Scalar(A.mul.Tensor(x, x), 0.25)
    power, total = A.ones_like.default(x), A.zeros_like.default(x)
    if order == 0:   # -(log(x/2) + γ) I0 + Σ_{k>=1} H_k (x²/4)^k / (k!)²
        for k in range(1, _BESSEL_J_TERMS):
            power = A.div.Scalar(A.mul.Tensor(power, q), k * k)
            total = A.add.Tensor(total, _times(power, _harmonic(k)))
        return A.sub.Tensor(total, A.mul.Tensor(_plus(log_half, _EULER_GAMMA), i))
    # 1/x + log(x/2) I1 - (x/4) Σ_{k>=0} (H_k + H_{k+1} - 2γ) (x²/4)^k / (k!(k+1)!)
    for k in range(_BESSEL_J_TERMS):
        if k:
            power = A.div.Scalar(A.mul.Tensor(power, q), k * (k + 1))
        total = A.add.Tensor(total, _times(power, _harmonic(k) + _harmonic(k + 1) - 2 * _EULER_GAMMA))
    return A.sub.Tensor(A.add.Tensor(A.reciprocal.default(x), A.mul.Tensor(log_half, i)),
                        A.mul.Tensor(A.mul.Scalar(x, 0.25), total))


def _bessel_k_trapezoid(x, order: float):
    """e^x K_order(x) for 2 <= x <= 20: the trapezoidal rule on ∫_0^∞ e^(-x(cosh t - 1)) cosh(νt) dt
    (float64); the nodes reach t = 4, where the integrand is below e^-50."""
    t = A.mul.Scalar(A.arange.start(0, _K_NODES, dtype=torch.float64, device=x.device), _K_STEP)
    e = A.exp.default(t)
    cosh_minus_one = A.sub.Scalar(A.mul.Scalar(A.add.Tensor(e, A.reciprocal.default(e)), 0.5), 1)
    integrand = A.exp.default(A.neg.default(A.mul.Tensor(A.unsqueeze.default(x, -1), cosh_minus_one)))
    if order:   # cosh(νt)
        integrand = A.mul.Tensor(integrand, A.mul.Scalar(A.add.Tensor(
            A.exp.default(A.mul.Scalar(t, order)), A.exp.default(A.mul.Scalar(t, -order))), 0.5))
    total = A.sum.dim_IntList(integrand, [-1])
    return A.mul.Scalar(A.sub.Scalar(total, 0.5), _K_STEP)   # the node at t = 0 (value 1) weighs 1/2


def _bessel_k_asymptotic(x, order: float):
    """e^x K_order(x) for x >= 20: √(π/(2x)) Σ_k a_k(ν) / x^k (float64)."""
    mu = 4.0 * order * order
    inverse = A.reciprocal.default(x)
    total, power, coefficient = A.ones_like.default(x), A.ones_like.default(x), 1.0
    for k in range(1, _HANKEL_TERMS):
        coefficient *= (mu - (2 * k - 1) ** 2) / (8 * k)
        power = A.mul.Tensor(power, inverse)
        total = A.add.Tensor(total, _times(power, coefficient))
    return A.mul.Tensor(total, A.rsqrt.default(_times(x, 2 / math.pi)))


def bessel_k(order: int, scaled: bool):
    def decomposition(x):
        """Modified Bessel function of the second kind, K0 or K1 (or e^x times it), float64
        inside: series up to 2, the trapezoidal rule to 20, the asymptotic expansion beyond; inf
        at ±0, NaN below 0 and at -inf, 0 at +inf, as eager. torch has no decomposition of it."""
        dtype = _float_result(x)
        wide = _wide(x)
        positive = A.where.self(A.gt.Scalar(wide, 0), wide, A.ones_like.default(wide))
        small = A.le.Scalar(positive, _K_SERIES_END)
        large = A.gt.Scalar(positive, _HANKEL_CROSSOVER)
        middle_x = A.clamp.default(positive, _K_SERIES_END, _HANKEL_CROSSOVER)
        series = _bessel_k_series(A.where.self(small, positive, A.ones_like.default(positive)), order)
        scaled_value = A.where.self(large, _bessel_k_asymptotic(A.where.self(large, positive, A.full_like.default(
            positive, _HANKEL_CROSSOVER)), order), _bessel_k_trapezoid(middle_x, order))
        exp_x = A.exp.default(positive)
        if scaled:
            y = A.where.self(small, A.mul.Tensor(series, exp_x), scaled_value)
        else:
            y = A.where.self(small, series, A.mul.Tensor(scaled_value, A.exp.default(A.neg.default(positive))))
        y = A.where.self(A.eq.Scalar(wide, 0), A.full_like.default(y, math.inf), y)
        y = A.where.self(A.eq.Scalar(wide, math.inf), A.zeros_like.default(y), y)
        y = A.where.self(A.lt.Scalar(wide, 0), A.full_like.default(y, math.nan), y)
        y = A.where.self(A.isnan.default(wide), wide, y)
        return y if dtype is torch.float64 else A._to_copy.default(y, dtype=dtype)
    return decomposition


# The Airy function Ai: Maclaurin series on [-10, 2.1] (50 terms: at -10 the largest is ~1e8,
# costing ~1e-8 absolute, and the 50th below 1e-17), Ai(x) = √(x/3)/π · K_(1/3)(ζ),
# ζ = (2/3)x^(3/2) >= 2, beyond (K by the trapezoidal
# rule up to ζ = 20, then its expansion), and for x < -10 the oscillating expansion
# Ai(-z) ~ (cos(ζ - π/4) Σ (-1)^k u_2k/ζ^2k + sin(ζ - π/4) Σ (-1)^k u_(2k+1)/ζ^(2k+1)) / (√π z^(1/4))
# (ζ >= 21: 12 terms, the last below 1e-17).
_AIRY_AI0, _AIRY_AI0_PRIME = 0.35502805388781723926, -0.25881940379280679840
_AIRY_SERIES_TERMS, _AIRY_SERIES_LOW, _AIRY_SERIES_HIGH, _AIRY_ASYMPTOTIC_TERMS = 50, -10.0, 2.1, 12


def _airy_series(x):
    """Ai(x) = Ai(0) f(x) + Ai'(0) g(x), f = Σ 3^k (1/3)_k x^3k / (3k)!, g = Σ 3^k (2/3)_k x^(3k+1) / (3k+1)!."""
    cube = A.mul.Tensor(A.mul.Tensor(x, x), x)
    f_term, g_term = A.ones_like.default(x), x
    f, g = f_term, g_term
    for k in range(1, _AIRY_SERIES_TERMS):
        f_term = A.div.Scalar(A.mul.Tensor(f_term, cube), (3 * k - 1) * (3 * k))
        g_term = A.div.Scalar(A.mul.Tensor(g_term, cube), (3 * k) * (3 * k + 1))
        f, g = A.add.Tensor(f, f_term), A.add.Tensor(g, g_term)
    return A.add.Tensor(_times(f, _AIRY_AI0), _times(g, _AIRY_AI0_PRIME))


def _airy_decaying(x):
    """Ai(x) for x > 2 from K_(1/3)(ζ) (float64)."""
    zeta = A.mul.Scalar(A.pow.Tensor_Scalar(x, 1.5), 2 / 3)
    large = A.gt.Scalar(zeta, _HANKEL_CROSSOVER)
    scaled = A.where.self(large, _bessel_k_asymptotic(A.where.self(large, zeta, A.full_like.default(zeta, _HANKEL_CROSSOVER)), 1 / 3),
                          _bessel_k_trapezoid(A.clamp.default(zeta, _K_SERIES_END, _HANKEL_CROSSOVER), 1 / 3))
    k = A.mul.Tensor(scaled, A.exp.default(A.neg.default(zeta)))
    return A.mul.Tensor(_times(A.sqrt.default(_times(x, 1 / 3)), 1 / math.pi), k)


def _airy_oscillating(z):
    """Ai(-z) for z > 10 (float64)."""
    zeta = A.mul.Scalar(A.pow.Tensor_Scalar(z, 1.5), 2 / 3)
    coefficients, u = [], 1.0
    for k in range(1, _AIRY_ASYMPTOTIC_TERMS):
        u *= (6 * k - 5) * (6 * k - 3) * (6 * k - 1) / ((2 * k - 1) * 216 * k)
        coefficients.append(u)
    even, odd = _oscillating_halves(A.reciprocal.default(zeta), coefficients)
    s, c = A.sin.default(zeta), A.cos.default(zeta)   # cos(ζ - π/4) = (c + s)/√2, sin(ζ - π/4) = (s - c)/√2
    value = A.add.Tensor(A.mul.Tensor(A.add.Tensor(c, s), even), A.mul.Tensor(A.sub.Tensor(s, c), odd))
    return A.div.Tensor(_times(value, 1 / math.sqrt(2 * math.pi)), A.pow.Tensor_Scalar(z, 0.25))


def airy_ai(x):
    """special.airy_ai in float64: the series on [-10, 2.1], K_(1/3) beyond, the oscillating
    expansion below -10; NaN at ±inf, as eager. Far below zero (|x| > ~1e4) eager's float32
    phase is lost (Ai(-1e6): float32 -0.0173, float64 -0.00219); the float64 value is given."""
    dtype = _float_result(x)
    wide = _wide(x)
    series = _airy_series(A.clamp.default(wide, _AIRY_SERIES_LOW, _AIRY_SERIES_HIGH))
    above = A.gt.Scalar(wide, _AIRY_SERIES_HIGH)
    below = A.lt.Scalar(wide, _AIRY_SERIES_LOW)
    y = A.where.self(above, _airy_decaying(A.where.self(above, wide, A.full_like.default(wide, 3.0))), series)
    y = A.where.self(below, _airy_oscillating(A.where.self(below, A.neg.default(wide), A.full_like.default(wide, 11.0))), y)
    y = A.where.self(A.isinf.default(wide), A.full_like.default(y, math.nan), y)
    return y if dtype is torch.float64 else A._to_copy.default(y, dtype=dtype)


# Chebyshev polynomials of the four kinds (and their shifted forms, x -> 2x - 1) of a tensor
# degree n, from their closed forms in float64: with x = cos θ on [-1, 1] and x = ±cosh φ
# beyond,
#   T_n = cos nθ,  U_n = sin (n+1)θ / sin θ,  V_n = cos (n+½)θ / cos (θ/2),  W_n = sin (n+½)θ / sin (θ/2),
# the hyperbolic ones for |x| > 1 (V_n(-x) = (-1)^n W_n(x)), eager's values at x = ±1 and ±inf,
# 0 below degree 0 (n truncated toward zero, as eager's cast to int64). Eager runs the
# three-term recurrence up to n (or cos(n·acos x) in float32 past n = 6 inside [-1, 1]): the
# closed forms give its values without a loop whose length is data.
def _chebyshev_inside(kind: str, theta, k):
    if kind == "t":
        return A.cos.default(A.mul.Tensor(k, theta))
    if kind == "u":
        return A.div.Tensor(A.sin.default(A.mul.Tensor(A.add.Scalar(k, 1), theta)), A.sin.default(theta))
    half = A.mul.Scalar(theta, 0.5)
    angle = A.mul.Tensor(A.add.Scalar(k, 0.5), theta)
    if kind == "v":
        return A.div.Tensor(A.cos.default(angle), A.cos.default(half))
    return A.div.Tensor(A.sin.default(angle), A.sin.default(half))


def _chebyshev_outside(kind: str, phi, k):
    """The kind's value at x = cosh φ > 1."""
    cosh = lambda t: A.mul.Scalar(A.add.Tensor(A.exp.default(t), A.exp.default(A.neg.default(t))), 0.5)
    sinh = lambda t: A.mul.Scalar(A.sub.Tensor(A.exp.default(t), A.exp.default(A.neg.default(t))), 0.5)
    if kind == "t":
        return cosh(A.mul.Tensor(k, phi))
    if kind == "u":
        return A.div.Tensor(sinh(A.mul.Tensor(A.add.Scalar(k, 1), phi)), sinh(phi))
    angle, half = A.mul.Tensor(A.add.Scalar(k, 0.5), phi), A.mul.Scalar(phi, 0.5)
    return A.div.Tensor(cosh(angle), cosh(half)) if kind == "v" else A.div.Tensor(sinh(angle), sinh(half))


_ASIN_TERMS = 30   # |s| <= 1/2: the terms shrink by s² <= 1/4, the 30th below 1e-18


def _asin_series(s):
    """asin(s) for |s| <= 1/2: Σ (2k)! / (4^k (k!)² (2k + 1)) s^(2k+1) (float64)."""
    square = A.mul.Tensor(s, s)
    term, total = s, s
    for k in range(1, _ASIN_TERMS):
        term = A.mul.Tensor(term, A.mul.Scalar(square, (2 * k - 1) ** 2 / ((2 * k) * (2 * k + 1))))
        total = A.add.Tensor(total, term)
    return total


def _acos(x):
    """acos on [-1, 1] in float64 (ONNX Runtime has no float64 Acos): π/2 - asin(x) in the middle,
    2 asin(√((1 - x)/2)) and π - 2 asin(√((1 + x)/2)) toward ±1, where both stay accurate."""
    half_angle = lambda distance: A.mul.Scalar(_asin_series(A.sqrt.default(A.mul.Scalar(distance, 0.5))), 2.0)
    near_one = half_angle(A.rsub.Scalar(A.clamp.default(x, 0.5, 1), 1))
    near_minus_one = A.sub.Tensor(_filled(x, math.pi), half_angle(A.add.Scalar(A.clamp.default(x, -1, -0.5), 1)))
    middle = A.sub.Tensor(_filled(x, math.pi / 2), _asin_series(A.clamp.default(x, -0.5, 0.5)))
    return A.where.self(A.gt.Scalar(x, 0.5), near_one, A.where.self(A.lt.Scalar(x, -0.5), near_minus_one, middle))


def _chebyshev_wide(kind: str, x, n):
    """The polynomial of this kind (float64 x and n, broadcast)."""
    k = A.trunc.default(n)
    parity = A.rsub.Scalar(A.mul.Scalar(A.sub.Tensor(k, A.mul.Scalar(A.floor.default(A.mul.Scalar(k, 0.5)), 2.0)), 2.0), 1)
    magnitude = A.abs.default(x)
    inside = A.le.Scalar(magnitude, 1)
    theta = _acos(A.clamp.default(x, -1, 1))
    value_inside = _chebyshev_inside(kind, theta, k)
    outside_x = A.where.self(inside, A.full_like.default(x, 2.0), magnitude)
    phi = A.log.default(A.add.Tensor(outside_x, A.sqrt.default(A.sub.Scalar(A.mul.Tensor(outside_x, outside_x), 1))))
    mirrored = {"t": "t", "u": "u", "v": "w", "w": "v"}[kind]   # P(-x) = (-1)^n Q(x)
    above = _chebyshev_outside(kind, phi, k)
    below = A.mul.Tensor(parity, _chebyshev_outside(mirrored, phi, k))
    y = A.where.self(inside, value_inside, A.where.self(A.gt.Scalar(x, 0), above, below))
    # at x = ±1 (θ = 0 or π: 0/0 for U, V, W) eager's values
    at_one = {"t": lambda: A.ones_like.default(y), "u": lambda: A.add.Scalar(k, 1),
              "v": lambda: A.ones_like.default(y), "w": lambda: A.add.Scalar(A.mul.Scalar(k, 2.0), 1)}[kind]()
    at_minus_one = {"t": parity, "u": A.mul.Tensor(parity, A.add.Scalar(k, 1)),
                    "v": A.mul.Tensor(parity, A.add.Scalar(A.mul.Scalar(k, 2.0), 1)), "w": parity}[kind]
    y = A.where.self(A.eq.Scalar(x, 1), at_one, y)
    y = A.where.self(A.eq.Scalar(x, -1), at_minus_one, y)
    y = A.where.self(A.eq.Scalar(k, 0), A.ones_like.default(y), y)
    y = A.where.self(A.isinf.default(x), _chebyshev_at_infinity(x, k), y)
    return A.where.self(A.lt.Scalar(k, 0), A.zeros_like.default(y), y)


def _chebyshev_at_infinity(x, k):
    """Eager's recurrence at ±inf: 1, x, inf for n = 0, 1, 2, then inf - inf = NaN."""
    y = A.where.self(A.eq.Scalar(k, 2), A.full_like.default(x, math.inf), A.full_like.default(x, math.nan))
    y = A.where.self(A.eq.Scalar(k, 1), x, y)
    return A.where.self(A.eq.Scalar(k, 0), A.ones_like.default(x), y)


def chebyshev(kind: str, shifted: bool = False):
    def decomposition(x, n):
        """special.(shifted_)chebyshev_polynomial_{t,u,v,w}(x, n) from the closed forms above, in
        float64. torch has no decomposition of them."""
        dtype = _float_result(x, n)
        like = x if isinstance(x, torch.Tensor) else n
        wide_like = _wide(A._to_copy.default(like, dtype=torch.float64))
        wx = _wide(x) if isinstance(x, torch.Tensor) else _filled(wide_like, x)
        wn = _wide(n) if isinstance(n, torch.Tensor) else _filled(wide_like, float(n))
        wx, wn = A.add.Tensor(wx, A.zeros_like.default(wn)), A.add.Tensor(wn, A.zeros_like.default(wx))
        if shifted:
            wx = A.sub.Scalar(A.mul.Scalar(wx, 2.0), 1)
        y = _chebyshev_wide(kind, wx, wn)
        return y if dtype is torch.float64 else A._to_copy.default(y, dtype=dtype)
    return decomposition
