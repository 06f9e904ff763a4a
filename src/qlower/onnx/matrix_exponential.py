"""linalg.matrix_exp for ONNX Runtime, written in ATen ops torchlib translates (torchlib has no
translation: OpInfo's matrix_exp ran in PyTorch).

Eager's algorithm (ATen's LinearAlgebra.cpp, after Bader, Blanes and Casas, "Computing the
Matrix Exponential with an Optimized Taylor Polynomial Approximation", Mathematics 2019): the
1-norm of each matrix picks a Taylor approximant of degree 1, 2, 4, 8 or 12 (each evaluated with
few products: T8 from 3, T12 from 4, T18 from 5), and a matrix whose norm reaches the degree-12
bound is scaled by 2^-s so that its norm is below the degree-18 bound, T18 is taken and squared s
times. That choice is made for a single matrix only: a batch of several (torch 2.13, measured in
float64, where T8 and T18 differ by 8e-13 at norm 0.03) takes the scaled T18 for every matrix.
The same bounds (per dtype), coefficients and products here; for one matrix every approximant is
computed and the norm picks one by `where`; the squarings run in an
ONNX Loop (torch's `while_loop`) as many times as the largest s, a matrix squared only while its
own count lasts. Results agree with eager to rounding (the products' summation order is the
engine's). Real floating dtypes, static sizes, at least one matrix; a 1×1 matrix is `exp`.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .conditional import only_when, static
from .loops import while_loop_of_static_shapes

A = torch.ops.aten

# eager's norm bounds of the degrees 1, 2, 4, 8, 12, 18, per dtype
_THETAS = {
    torch.float32: (1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02,
                    5.800524627688768e-01, 1.461661507209034e+00, 3.010066362817634e+00),
    torch.float64: (2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04,
                    4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e+00),
}

# T12 and T18: row i holds the coefficients of B_i over (I, A, A², A³) / (I, A, A², A³, A⁶)
_T12 = ((9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
        (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031, 0.01108844528519167989),
        (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968, 0.00610700528898058230),
        (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079, -0.00675951846863086359))
_T18 = ((0., -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04, 0.),
        (0., 3.97849749499645077844e-01, 1.36783778460411720168e+00, 4.98289622525382669416e-01,
         -6.37898194594723280150e-04),
        (-1.09676396052962061844e+01, 1.68015813878906206114e+00, 5.71779846478865511061e-02,
         -6.98210122488052056106e-03, 3.34975017086070470649e-05),
        (-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
         2.95552570429315521194e-02, -1.39180257516060693404e-05),
        (0., 0., -9.23364619367118555360e-02, -1.69364939002081722752e-02, -1.40086798182036094347e-05))

_SEQUENTIAL_MAX = 8   # matrices up to this size: products as eager's (_product)

def _t8_constants(dtype) -> tuple[float, ...]:
    """x1..x7 and y2 of T8, as eager computes them: sqrt(177) and 2/3 held in the matrix's dtype
    (`constexpr scalar_t`), the rest in double, each result rounded to the dtype (float32: the
    constants from double throughout left a single matrix of norm 0.5 7e-9 off)."""
    held = (lambda c: float(np.float32(c))) if dtype is torch.float32 else float
    sqrt_177, x3 = held(0.1330413469565007072504e+2), held(2. / 3.)
    x1 = held(x3 * ((1. + sqrt_177) / 88.))
    x2 = held(x3 * ((1. + sqrt_177) / 352.))
    x4 = held((-271. + 29. * sqrt_177) / (315. * x3))
    x5 = held((-11. + 11. * sqrt_177) / (1260. * x3))
    x6 = held((-99. + 11. * sqrt_177) / (5040. * x3))
    x7 = held((89. - sqrt_177) / (5040. * x3))
    y2 = held((857. - 58. * sqrt_177) / 630.)
    return x1, x2, x3, x4, x5, x6, x7, y2


def _product(a, b):
    """a @ b. Up to _SEQUENTIAL_MAX, as eager's float32 matmul computes it: sum over k in order
    of the rounded products a[:, k] b[k, :], no fused multiply-add (measured, torch 2.13 CPU:
    bit-identical on every draw for n <= 8, batched or not, and never for n >= 9, where it
    switches to a blocked kernel); ONNX Runtime's MatMul sums in another order, and the squarings
    amplify the difference (OpInfo's 5x5 batch, norm ~27: 1.9e-4 off at an element of 0.15,
    beyond its tolerance, while eager itself is 5e-2 from the exact value there)."""
    n = a.shape[-1]
    if n > _SEQUENTIAL_MAX:
        return A.matmul.default(a, b)
    total = None
    for k in range(n):
        term = A.mul.Tensor(A.slice.Tensor(a, -1, k, k + 1), A.slice.Tensor(b, -2, k, k + 1))
        total = term if total is None else A.add.Tensor(total, term)
    return total


def _combination(mats, coefficients):
    """sum_j coefficients[j] * mats[j] (a coefficient 0 skipped)."""
    total = None
    for m, c in zip(mats, coefficients):
        if c == 0:
            continue
        term = A.mul.Scalar(m, c)
        total = term if total is None else A.add.Tensor(total, term)
    return total


def _powers(a, count: int):
    """The first `count` of I, A, A², A³, A⁶."""
    n = a.shape[-1]
    eye = A.expand.default(A.eye.default(n, dtype=a.dtype), list(a.shape))
    mats = [eye, a]
    if count > 2:
        mats.append(_product(a, a))
    if count > 3:
        mats.append(_product(a, mats[2]))
    if count > 4:
        mats.append(_product(mats[3], mats[3]))
    return mats


def _t1(a):
    i, a1 = _powers(a, 2)
    return A.add.Tensor(i, a1)


def _t2(a):
    i, a1, a2 = _powers(a, 3)
    return _combination((i, a1, a2), (1.0, 1.0, 0.5))


def _t4(a):
    i, a1, a2 = _powers(a, 3)
    tail = _product(a2, _combination((i, a1, a2), (1 / 2.0, 1 / 6.0, 1 / 24.0)))
    return _combination((i, a1, tail), (1.0, 1.0, 1.0))


def _t8(a):
    x1, x2, x3, x4, x5, x6, x7, y2 = _t8_constants(a.dtype)
    i, a1, a2 = _powers(a, 3)
    a4 = _product(a2, _combination((a1, a2), (x1, x2)))
    a8 = _product(_combination((a2, a4), (x3, 1.0)), _combination((i, a1, a2, a4), (x4, x5, x6, x7)))
    return _combination((i, a1, a2, a8), (1.0, 1.0, y2, 1.0))


def _t12(a):
    mats = _powers(a, 4)
    b0, b1, b2, b3 = (_combination(mats, row) for row in _T12)
    b2 = A.add.Tensor(b2, _product(b3, b3))                # A6
    return A.add.Tensor(b0, _product(A.add.Tensor(b1, b2), b2))


def _t18(a):
    mats = _powers(a, 5)
    b0, b1, b2, b3, b4 = (_combination(mats, row) for row in _T18)
    b3 = A.add.Tensor(b3, _product(b0, b4))                # A9
    return A.add.Tensor(b1, _product(A.add.Tensor(b2, b3), b3))


# Cond and body: module-level, closing over nothing (loops.py).
def _squarings_left(k, m, s):
    return A.lt.Tensor(k, A.max.default(s))


def _square_where_due(k, m, s):
    due = A.reshape.default(A.lt.Tensor(k, s), [s.shape[0], 1, 1])
    return A.add.Scalar(k, 1), A.where.self(due, _product(m, m), m), A.clone.default(s)


def _t18_scaled_and_squared(a, norm, theta: float):
    s = A.ceil.default(A.log2.default(A.div.Scalar(norm, theta)))
    s = A._to_copy.default(A.clamp_min.default(s, 0.0), dtype=torch.int64)
    scale = A.pow.Scalar(2.0, A._to_copy.default(s, dtype=a.dtype))
    m = _t18(A.div.Tensor(a, A.reshape.default(scale, [s.shape[0], 1, 1])))
    k = A.full.default([], 0, dtype=torch.int64)
    return while_loop_of_static_shapes(_squarings_left, _square_where_due, (k, m, s))[1]


def _applies(a) -> bool:
    return a.dtype in _THETAS and a.dim() >= 2 and static(*a.shape) and a.numel() > 0


@only_when(_applies)
def linalg_matrix_exp(a):
    n = a.shape[-1]
    if n == 1:
        return A.exp.default(a)
    batch = math.prod(a.shape[:-2])
    a3 = A.reshape.default(a, [batch, n, n])
    thetas = _THETAS[a.dtype]
    norm = A.amax.default(A.sum.dim_IntList(A.abs.default(a3), [-2]), [-1])     # [batch]
    value = _t18_scaled_and_squared(a3, norm, thetas[5])
    if batch > 1:
        return A.reshape.default(value, list(a.shape))   # eager: the highest degree for a batch
    # one matrix, as eager: degree i where thetas[i-1] < norm <= thetas[i]; T18 where norm >= thetas[4]
    for theta, approximant in reversed(list(zip(thetas[:5], (_t1, _t2, _t4, _t8, _t12)))):
        takes = (A.lt if approximant is _t12 else A.le).Scalar(norm, theta)
        value = A.where.self(A.reshape.default(takes, [batch, 1, 1]), approximant(a3), value)
    return A.reshape.default(value, list(a.shape))


DECOMPOSITIONS = {A.linalg_matrix_exp.default: linalg_matrix_exp}
