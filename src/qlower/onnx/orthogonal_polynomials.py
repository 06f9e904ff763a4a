"""The orthogonal polynomials without a closed form — Hermite H and He, Laguerre L, Legendre P —
for ONNX Runtime: eager's three-term recurrences, run up to the largest degree in the call by
an ONNX Loop (torch's `while_loop`, which torch.onnx translates to Loop), each element keeping
its value once its own degree is reached. torchlib has no translation for them (OpInfo:
special.hermite_polynomial_h / _he, laguerre_polynomial_l, legendre_polynomial_p ran in
PyTorch). The degree is a tensor (truncated to an integer, as eager), so the loop count is known
only at run time.

The recurrences and special cases are eager's (ATen's Math.h): n < 0 gives 0, n = 0 gives 1,
n = 1 the first-degree polynomial; Laguerre at x = 0 is 1; Legendre at |x| = 1 is 1, or -1 for
x = -1 and odd n. Each step in the input's dtype, in eager's operation order.
"""
from __future__ import annotations

import torch

from .conditional import only_when
from .loops import while_loop_of_static_shapes

A = torch.ops.aten


def _float_input(x, n) -> bool:
    return x.dtype.is_floating_point


# Conds and bodies are module-level and close over nothing: what they need is carried (loops.py).
def _cond(k, p, q, x, bound, last):
    return A.lt.Tensor(k, last)


def _advance(k, p, q, r, bound, stride: int):
    live = A.lt.Tensor(k, bound)
    return A.add.Scalar(k, stride), A.where.self(live, q, p), A.where.self(live, r, q)


def _hermite_h_body(k, p, q, x, bound, last):
    r = A.sub.Tensor(A.mul.Tensor(A.add.Tensor(x, x), q), A.mul.Tensor(A._to_copy.default(k, dtype=x.dtype), p))
    return (*_advance(k, p, q, r, bound, 2), A.clone.default(x), A.clone.default(bound), A.clone.default(last))


def _hermite_he_body(k, p, q, x, bound, last):
    r = A.sub.Tensor(A.mul.Tensor(x, q), A.mul.Tensor(A._to_copy.default(k, dtype=x.dtype), p))
    return (*_advance(k, p, q, r, bound, 1), A.clone.default(x), A.clone.default(bound), A.clone.default(last))


def _laguerre_l_body(k, p, q, x, bound, last):
    kf = A._to_copy.default(k, dtype=x.dtype)
    factor = A.add.Tensor(A.add.Tensor(kf, kf), A.rsub.Scalar(x, 1))
    r = A.div.Tensor(A.sub.Tensor(A.mul.Tensor(factor, q), A.mul.Tensor(kf, p)), A.add.Scalar(kf, 1))
    return (*_advance(k, p, q, r, bound, 1), A.clone.default(x), A.clone.default(bound), A.clone.default(last))


def _legendre_p_body(k, p, q, x, bound, last):
    kf = A._to_copy.default(k, dtype=x.dtype)
    factor = A.mul.Tensor(A.add.Scalar(A.add.Tensor(kf, kf), 1), x)
    r = A.div.Tensor(A.sub.Tensor(A.mul.Tensor(factor, q), A.mul.Tensor(kf, p)), A.add.Scalar(kf, 1))
    return (*_advance(k, p, q, r, bound, 1), A.clone.default(x), A.clone.default(bound), A.clone.default(last))


def _recurrence(x, m, first, body, stride: int):
    """q after each element's own number of steps: (p, q) = (1, first) at k = k0, then
    (q, r) while k < its bound; k advances by `stride`. Hermite H counts k = 2, 4, .. below 2n
    (stride 2), the others k = 1, 2, .. below n."""
    bound = A.mul.Scalar(m, stride)
    last = A.amax.default(bound, list(range(bound.dim()))) if bound.dim() else A.clone.default(bound)
    k = A.full.default([], 2 if stride == 2 else 1, dtype=torch.int64)
    carried = (k, A.ones_like.default(x), A.clone.default(first), A.clone.default(x), bound, last)
    return while_loop_of_static_shapes(_cond, body, carried)[2]


def _low_degrees(x, m, first, value):
    """eager's cases n < 0 (0), n = 0 (1), n = 1 (`first`) around the recurrence's value."""
    value = A.where.self(A.eq.Scalar(m, 1), first, value)
    value = A.where.self(A.eq.Scalar(m, 0), A.ones_like.default(x), value)
    return A.where.self(A.lt.Scalar(m, 0), A.zeros_like.default(x), value)


def _broadcast(x, n):
    x, n = A.broadcast_tensors.default([x, n])
    return x, A._to_copy.default(n, dtype=torch.int64)


@only_when(_float_input)
def hermite_h(x, n):
    x, m = _broadcast(x, n)
    two_x = A.add.Tensor(x, x)
    return _low_degrees(x, m, two_x, _recurrence(x, m, two_x, _hermite_h_body, 2))


@only_when(_float_input)
def hermite_he(x, n):
    x, m = _broadcast(x, n)
    return _low_degrees(x, m, x, _recurrence(x, m, x, _hermite_he_body, 1))


@only_when(_float_input)
def laguerre_l(x, n):
    x, m = _broadcast(x, n)
    first = A.rsub.Scalar(x, 1)
    value = _low_degrees(x, m, first, _recurrence(x, m, first, _laguerre_l_body, 1))
    at_zero = A.logical_and.default(A.eq.Scalar(A.abs.default(x), 0), A.ge.Scalar(m, 0))
    return A.where.self(at_zero, A.ones_like.default(x), value)


@only_when(_float_input)
def legendre_p(x, n):
    x, m = _broadcast(x, n)
    value = _low_degrees(x, m, x, _recurrence(x, m, x, _legendre_p_body, 1))
    odd = A.eq.Scalar(A.remainder.Scalar(m, 2), 1)
    edge = A.where.self(A.logical_and.default(A.lt.Scalar(x, 0), odd), A.neg.default(A.ones_like.default(x)),
                        A.ones_like.default(x))
    at_edge = A.logical_and.default(A.eq.Scalar(A.abs.default(x), 1), A.ge.Scalar(m, 0))
    return A.where.self(at_edge, edge, value)


def _with_scalar_degree(fn):
    def decomposition(x, n):
        return fn(x, A.full.default([], n, dtype=torch.float64 if isinstance(n, float) else torch.int64))
    decomposition.applies = lambda x, n: x.dtype.is_floating_point
    return only_when(decomposition.applies)(decomposition)


DECOMPOSITIONS = {
    A.special_hermite_polynomial_h.default: hermite_h,
    A.special_hermite_polynomial_he.default: hermite_he,
    A.special_laguerre_polynomial_l.default: laguerre_l,
    A.special_legendre_polynomial_p.default: legendre_p,
    A.special_hermite_polynomial_h.n_scalar: _with_scalar_degree(hermite_h),
    A.special_hermite_polynomial_he.n_scalar: _with_scalar_degree(hermite_he),
    A.special_laguerre_polynomial_l.n_scalar: _with_scalar_degree(laguerre_l),
    A.special_legendre_polynomial_p.n_scalar: _with_scalar_degree(legendre_p),
}
