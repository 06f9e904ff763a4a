"""The regularized incomplete gamma functions igamma = P(a, x) and igammac = Q(a, x) for ONNX
Runtime, evaluated in float64: the power series for P where x < a + 1 (or x <= 1), Lentz's
continued fraction for Q elsewhere (the textbook split), each run by an ONNX Loop (torch's
`while_loop`) until every element's next term is below float64 rounding, at most MAX_STEPS
steps. torch's own decompositions end in prims.igamma / prims.igammac, which torchlib does not
translate (OpInfo: igamma, igammac ran in PyTorch).

Eager's special cases (ATen's Math.h): NaN for a < 0 or x < 0 (and for a = 0 with x = 0, or
both infinite); P = 1 for a = 0 with x > 0 and for x = inf; P = 0 for x = 0 and for a = inf;
NaN stays NaN. Eager evaluates float32 inputs in float32 (with Temme's asymptotic series where
a ~ x and a > 20); the float64 evaluation here agrees with it to its own rounding.
"""
from __future__ import annotations

import math

import torch

from .conditional import only_when
from .loops import while_loop_of_static_shapes

A = torch.ops.aten
MAX_STEPS = 4000   # the series needs ~ a + 10·sqrt(a) terms near x = a; Lentz ~ sqrt(a) + 30
_TINY = 1e-300
_EPS = 1.0e-16


def _prefactor(a, x):
    """x^a e^-x / Γ(a), from logs (lgamma in float64, special_functions.lgamma)."""
    from .special_functions import lgamma
    return A.exp.default(A.sub.Tensor(A.sub.Tensor(A.mul.Tensor(a, A.log.default(x)), x), lgamma(a)))


# Conds and bodies: module-level, one per loop, closing over nothing (loops.py).
def _series_unfinished(k, term, total, a, x, done):
    return A.logical_and.default(A.lt.Scalar(k, MAX_STEPS), A.logical_not.default(A.all.default(done)))


def _fraction_unfinished(k, b, c, d, h, a, x, done):
    return A.logical_and.default(A.lt.Scalar(k, MAX_STEPS), A.logical_not.default(A.all.default(done)))


def _series_step(k, term, total, a, x, done):
    """term_n = x^n / ((a+1)...(a+n)); total = sum of terms (times e^-x x^a / Γ(a+1) later)."""
    term = A.mul.Tensor(term, A.div.Tensor(x, A.add.Tensor(a, A._to_copy.default(k, dtype=torch.float64))))
    total = A.add.Tensor(total, term)
    small = A.le.Tensor(A.abs.default(term), A.mul.Scalar(A.abs.default(total), _EPS))
    done = A.logical_or.default(done, A.logical_or.default(small, A.isnan.default(total)))
    return A.add.Scalar(k, 1), term, total, A.clone.default(a), A.clone.default(x), done


def _fraction_step(k, b, c, d, h, a, x, done):
    """One step of Lentz's method for the continued fraction of Q (Numerical Recipes' gcf)."""
    i = A._to_copy.default(k, dtype=torch.float64)
    an = A.neg.default(A.mul.Tensor(i, A.sub.Tensor(i, a)))   # a_n = -n (n - a)
    b = A.add.Scalar(b, 2.0)
    d = A.add.Tensor(A.mul.Tensor(an, d), b)
    tiny = A.full.default([], _TINY, dtype=torch.float64)
    d = A.where.self(A.lt.Scalar(A.abs.default(d), _TINY), tiny, d)
    c = A.add.Tensor(b, A.div.Tensor(an, c))
    c = A.where.self(A.lt.Scalar(A.abs.default(c), _TINY), tiny, c)
    d = A.reciprocal.default(d)
    delta = A.mul.Tensor(d, c)
    h = A.where.self(done, h, A.mul.Tensor(h, delta))
    small = A.lt.Scalar(A.abs.default(A.sub.Scalar(delta, 1.0)), _EPS)
    done = A.logical_or.default(done, A.logical_or.default(small, A.isnan.default(h)))
    return A.add.Scalar(k, 1), b, c, d, h, A.clone.default(a), A.clone.default(x), done


def _series(a, x, skip):
    """P(a, x) by its power series (elements in `skip` start done)."""
    k = A.full.default([], 1, dtype=torch.int64)
    first = A.reciprocal.default(a)
    carried = (k, A.clone.default(first), A.clone.default(first), A.clone.default(a), A.clone.default(x),
               A.clone.default(skip))
    total = while_loop_of_static_shapes(_series_unfinished, _series_step, carried)[2]
    return A.mul.Tensor(_prefactor(a, x), total)


def _fraction(a, x, skip):
    """Q(a, x) by Lentz's continued fraction (elements in `skip` start done)."""
    b = A.sub.Tensor(A.add.Scalar(x, 1.0), a)
    b = A.where.self(skip, A.ones_like.default(b), b)   # (their value is not used)
    c = A.full_like.default(x, 1.0 / _TINY)
    d = A.reciprocal.default(b)
    k = A.full.default([], 1, dtype=torch.int64)
    carried = (k, b, c, A.clone.default(d), A.clone.default(d), A.clone.default(a), A.clone.default(x),
               A.clone.default(skip))
    h = while_loop_of_static_shapes(_fraction_unfinished, _fraction_step, carried)[4]
    return A.mul.Tensor(_prefactor(a, x), h)


def _special_cases(a, x, p, lower: bool):
    """eager's values at the edges of the domain, around p (P for igamma, Q for igammac)."""
    nan = A.full_like.default(p, math.nan)
    one, zero = A.ones_like.default(p), A.zeros_like.default(p)
    full, empty = (one, zero) if lower else (zero, one)     # P = 1 / P = 0, as the function asked
    y = A.where.self(A.isinf.default(x), full, p)
    y = A.where.self(A.isinf.default(a), A.where.self(A.isinf.default(x), nan, empty), y)
    y = A.where.self(A.eq.Scalar(x, 0), empty, y)
    y = A.where.self(A.eq.Scalar(a, 0), A.where.self(A.gt.Scalar(x, 0), full, nan), y)
    invalid = A.logical_or.default(A.lt.Scalar(a, 0), A.lt.Scalar(x, 0))
    invalid = A.logical_or.default(invalid, A.logical_or.default(A.isnan.default(a), A.isnan.default(x)))
    return A.where.self(invalid, nan, y)


def _incomplete_gamma(a, x, lower: bool):
    dtype = torch.result_type(a, x)
    a, x = A.broadcast_tensors.default([A._to_copy.default(a, dtype=torch.float64), A._to_copy.default(x, dtype=torch.float64)])
    regular = A.logical_and.default(A.gt.Scalar(a, 0), A.gt.Scalar(x, 0))
    regular = A.logical_and.default(regular, A.logical_and.default(A.isfinite.default(a), A.isfinite.default(x)))
    by_fraction = A.logical_and.default(A.gt.Scalar(x, 1.0), A.gt.Tensor(x, A.add.Scalar(a, 1.0)))
    ones = A.ones_like.default(a)
    a_safe, x_safe = A.where.self(regular, a, ones), A.where.self(regular, x, ones)
    use_series = A.logical_and.default(regular, A.logical_not.default(by_fraction))
    use_fraction = A.logical_and.default(regular, by_fraction)
    p = _series(a_safe, x_safe, A.logical_not.default(use_series))
    q = _fraction(a_safe, x_safe, A.logical_not.default(use_fraction))
    value = A.where.self(use_fraction, A.rsub.Scalar(q, 1.0), p) if lower else \
        A.where.self(use_fraction, q, A.rsub.Scalar(p, 1.0))
    value = A.clamp.default(value, 0.0, 1.0)
    return A._to_copy.default(_special_cases(a, x, value, lower), dtype=dtype)


def _floating(a, x) -> bool:
    return a.dtype.is_floating_point or x.dtype.is_floating_point


@only_when(_floating)
def igamma(a, x):
    return _incomplete_gamma(a, x, lower=True)


@only_when(_floating)
def igammac(a, x):
    return _incomplete_gamma(a, x, lower=False)


DECOMPOSITIONS = {A.igamma.default: igamma, A.igammac.default: igammac}
