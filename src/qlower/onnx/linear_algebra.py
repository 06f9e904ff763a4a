"""Dense linear algebra for ONNX Runtime, written in ATen ops torchlib translates: LU with
partial pivoting (and what is built on it: solves, inverse, slogdet, unpacking), triangular
solves, Cholesky and its solves, Householder QR (geqrf, householder_product, qr, ormqr).
ONNX has no factorization op, and torch's own decompositions of these end in LAPACK calls.

Each factorization is unrolled over the matrix's static size (one step per column, the batch
dims vectorized), evaluated in float64 and returned in the input's dtype; LAPACK's conventions
are kept so results equal eager's to rounding: the first largest pivot (isamax), 1-based int32
pivots and info, geqrf's reflector signs (beta = -sign(alpha)·norm, tau = 0 for a zero
column), only the referenced triangle read. Sizes above MAX_UNROLLED stay in PyTorch.

Ops that raise in eager on a singular or not positive-definite input (linalg.inv,
linalg.solve, linalg.cholesky, cholesky, linalg.lu_factor) are not decomposed: an ONNX graph
cannot raise, so they stay in PyTorch. Their `_ex` forms, which report `info` instead, are
decomposed; where info is nonzero their other values are the factorization's own (inf/NaN
from the zero pivot on), where eager's are LAPACK's partial work (docs/coverage.md).
"""
from __future__ import annotations

import torch

from .conditional import only_when, static

A = torch.ops.aten
# Every column is one unrolled step (~15 ops): beyond this a factorization stays in PyTorch.
MAX_UNROLLED = 64


def _small(*tensors) -> bool:
    return all(t.dim() >= 2 and static(*t.shape) and max(t.shape[-2:]) <= MAX_UNROLLED for t in tensors)


def _wide(x):
    return x if x.dtype is torch.float64 else A._to_copy.default(x, dtype=torch.float64)


def _narrow(x, like):
    return x if x.dtype is like.dtype else A._to_copy.default(x, dtype=like.dtype)


def _index(n: int, like):
    return A.arange.default(n, dtype=torch.int64, device=like.device)


def _column(a, j: int):
    """a[..., :, j] as [..., m]."""
    return A.select.int(a, -1, j)


def _row(a, i: int):
    """a[..., i, :] as [..., n]."""
    return A.select.int(a, -2, i)


def _transpose(a):
    return A.transpose.int(a, -2, -1)


def _triangle(a, lower: bool, unit: bool = False):
    """The referenced triangle of a (the rest 0, read through `where` so inf/NaN there stay out),
    with a unit diagonal where `unit`."""
    m, n = a.shape[-2], a.shape[-1]
    rows = A.unsqueeze.default(_index(m, a), 1)
    cols = A.unsqueeze.default(_index(n, a), 0)
    keep = A.gt.Tensor(rows, cols) if lower else A.lt.Tensor(rows, cols)
    if not unit:
        keep = A.logical_or.default(keep, A.eq.Tensor(rows, cols))
    t = A.where.self(keep, a, A.zeros_like.default(a))
    if unit:
        t = A.where.self(A.eq.Tensor(rows, cols), A.ones_like.default(a), t)
    return t


def _solve_triangular(t, b, lower: bool, unit: bool = False):
    """x with t·x = b by substitution, t triangular [..., n, n] (only its triangle read), b
    [..., n, k]; the batch dims broadcast. Unsolved rows of x are 0 while a row is solved."""
    n = t.shape[-1]
    t = _triangle(t, lower, unit)
    x = A.zeros_like.default(A.matmul.default(t, b))
    rows = _index(n, t)
    for i in (range(n) if lower else reversed(range(n))):
        r = A.sub.Tensor(A.slice.Tensor(b, -2, i, i + 1), A.matmul.default(A.slice.Tensor(t, -2, i, i + 1), x))
        if not unit:
            r = A.div.Tensor(r, A.slice.Tensor(A.slice.Tensor(t, -2, i, i + 1), -1, i, i + 1))
        here = A.unsqueeze.default(A.eq.Scalar(rows, i), 1)
        x = A.where.self(here, r, x)
    return x


def _lu(a):
    """LU with partial pivoting of a [..., m, n] (float64): (LU packed as LAPACK's getrf, the row
    order as an int64 permutation [..., m], the 1-based int32 pivots, int32 info)."""
    m, n = a.shape[-2], a.shape[-1]
    rows, cols = _index(m, a), _index(n, a)
    perm = A.expand.default(rows, list(a.shape[:-1]))
    info = A.zeros_like.default(A.select.int(_column(a, 0), -1, 0), dtype=torch.int32)
    pivots = []
    for k in range(min(m, n)):
        magnitude = A.where.self(A.ge.Scalar(rows, k), A.abs.default(_column(a, k)), A.full_like.default(_column(a, k), -1.0))
        p = A.argmax.default(magnitude, -1, True)                       # the first largest, as isamax
        swap = A.where.self(A.eq.Scalar(rows, k), p, A.where.self(A.eq.Tensor(rows, p), A.full_like.default(p, k), rows))
        a = A.gather.default(a, -2, A.expand.default(A.unsqueeze.default(swap, -1), list(a.shape)))
        perm = A.gather.default(perm, -1, swap)
        pivot = A.select.int(_column(a, k), -1, k)
        zero = A.eq.Scalar(pivot, 0)
        safe = A.where.self(zero, A.ones_like.default(pivot), pivot)    # a zero pivot's column is 0 below: kept
        below = A.gt.Scalar(rows, k)
        multipliers = A.where.self(below, A.div.Tensor(_column(a, k), A.unsqueeze.default(safe, -1)),
                                   A.zeros_like.default(_column(a, k)))
        update = A.mul.Tensor(A.unsqueeze.default(multipliers, -1), A.unsqueeze.default(_row(a, k), -2))
        trailing = A.logical_and.default(A.unsqueeze.default(below, 1), A.unsqueeze.default(A.gt.Scalar(cols, k), 0))
        a = A.where.self(trailing, A.sub.Tensor(a, update), a)
        stored = A.logical_and.default(A.unsqueeze.default(below, 1), A.unsqueeze.default(A.eq.Scalar(cols, k), 0))
        a = A.where.self(stored, A.unsqueeze.default(multipliers, -1), a)
        pivots.append(A._to_copy.default(A.add.Scalar(p, 1), dtype=torch.int32))
        failed = A.logical_and.default(A.eq.Scalar(info, 0), zero)
        info = A.where.self(failed, A.full_like.default(info, k + 1), info)
    return a, perm, A.cat.default(pivots, -1), info


def _permutation_matrix(perm, m: int, dtype):
    """P with A = P·L·U for the row order perm (row i of L·U is row perm[i] of A)."""
    one_hot = A.eq.Tensor(A.unsqueeze.default(perm, -1), _index(m, perm))   # [i, r] = perm[i] == r
    return A._to_copy.default(_transpose(one_hot), dtype=dtype)


def _unpack(lu, m: int, n: int):
    """(L [m, k] unit lower, U [k, n] upper) from a packed LU, k = min(m, n)."""
    k = min(m, n)
    lower = _triangle(A.slice.Tensor(lu, -1, 0, k), lower=True, unit=True)
    upper = _triangle(A.slice.Tensor(lu, -2, 0, k), lower=False)
    return lower, upper


def _order_from_pivots(pivots, m: int):
    """The row order getrf's pivots (1-based swaps, applied in sequence) leave."""
    order = A.expand.default(_index(m, pivots), list(pivots.shape[:-1]) + [m])
    rows = _index(m, pivots)
    for k in range(pivots.shape[-1]):
        p = A.sub.Scalar(A._to_copy.default(A.slice.Tensor(pivots, -1, k, k + 1), dtype=torch.int64), 1)
        swap = A.where.self(A.eq.Scalar(rows, k), p, A.where.self(A.eq.Tensor(rows, p), A.full_like.default(p, k), rows))
        order = A.gather.default(order, -1, swap)
    return order


def _lu_solve(lu, order, b, adjoint: bool):
    """x with A·x = b (or Aᵀ·x = b) from A's packed LU and row order (float64)."""
    if not adjoint:
        rows = A.expand.default(A.unsqueeze.default(order, -1), list(order.shape) + [b.shape[-1]])
        permuted = A.gather.default(A.add.Tensor(b, A.zeros_like.default(A.slice.Tensor(lu, -1, 0, 1))), -2, rows)
        y = _solve_triangular(lu, permuted, lower=True, unit=True)
        return _solve_triangular(lu, y, lower=False)
    z = _solve_triangular(_transpose(lu), b, lower=True)              # Uᵀ z = b
    y = _solve_triangular(_transpose(lu), z, lower=False, unit=True)  # Lᵀ y = z
    inverse = A.argsort.default(order, -1)                           # x = P y: x[order[i]] = y[i]
    rows = A.expand.default(A.unsqueeze.default(inverse, -1), list(inverse.shape) + [b.shape[-1]])
    return A.gather.default(y, -2, rows)


@only_when(lambda a, pivot=True, check_errors=False: pivot and not check_errors and _small(a))
def _linalg_lu_factor_ex(a, pivot=True, check_errors=False):
    lu, _, pivots, info = _lu(_wide(a))
    return _narrow(lu, a), pivots, info


@only_when(lambda a, pivot=True: pivot and _small(a))
def _linalg_lu(a, pivot=True):
    m, n = a.shape[-2], a.shape[-1]
    lu, perm, _, _ = _lu(_wide(a))
    lower, upper = _unpack(_narrow(lu, a), m, n)
    return _permutation_matrix(perm, m, a.dtype), lower, upper


@only_when(lambda lu, pivots, unpack_data=True, unpack_pivots=True: _small(lu))
def _lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    """P, L, U from getrf's output; a part not asked for is an empty tensor, as eager."""
    m, n = lu.shape[-2], lu.shape[-1]
    empty = A.new_zeros.default(lu, [0])
    lower, upper = _unpack(lu, m, n) if unpack_data else (empty, empty)
    p = _permutation_matrix(_order_from_pivots(pivots, m), m, lu.dtype) if unpack_pivots else empty
    return p, lower, upper


def _solved_on_the_left(solve, b, left: bool):
    """solve(b) for A·x = b; x·A = b as Aᵀ·xᵀ = bᵀ (solve's `adjoint` flips)."""
    return solve(b, False) if left else _transpose(solve(_transpose(b), True))


@only_when(lambda lu, pivots, b, *, left=True, adjoint=False: _small(lu, b))
def _linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    order = _order_from_pivots(pivots, lu.shape[-2])
    wide = _wide(lu)
    x = _solved_on_the_left(lambda rhs, flip: _lu_solve(wide, order, _wide(rhs), adjoint != flip), b, left)
    return _narrow(x, b)


def _vector_right_side(a, b) -> bool:
    """linalg.solve's rule: b is a batch of vectors when b.dim() == 1 or b is a.shape[:-1]."""
    return b.dim() == 1 or (b.dim() == a.dim() - 1 and tuple(b.shape) == tuple(a.shape[:-1]))


@only_when(lambda a, b, *, left=True, check_errors=False: not check_errors and _small(a) and static(*b.shape))
def _linalg_solve_ex(a, b, *, left=True, check_errors=False):
    lu, order, pivots, info = _lu(_wide(a))
    vector = _vector_right_side(a, b)
    rhs = A.unsqueeze.default(b, -1) if vector else b
    x = _solved_on_the_left(lambda r, flip: _lu_solve(lu, order, _wide(r), flip), rhs, left)
    x = A.squeeze.dim(x, -1) if vector else x
    return _narrow(x, b), _narrow(lu, a), pivots, info


@only_when(lambda a, *, check_errors=False: not check_errors and _small(a))
def _linalg_inv_ex(a, *, check_errors=False):
    lu, order, _, info = _lu(_wide(a))
    eye = A.add.Tensor(A.eye.default(a.shape[-1], dtype=torch.float64, device=a.device), A.zeros_like.default(lu))
    return _narrow(_lu_solve(lu, order, eye, False), a), info


@only_when(lambda a: _small(a))
def _linalg_slogdet(a):
    """sign · exp(logabsdet) = det: the product of U's diagonal and the parity of the pivots."""
    lu, _, pivots, _ = _lu(_wide(a))
    diagonal = A.diagonal.default(lu, 0, -2, -1)
    n = a.shape[-1]
    swaps = A.sum.dim_IntList(A._to_copy.default(A.ne.Tensor(pivots, A.add.Scalar(_index(n, a), 1)), dtype=torch.float64), [-1])
    parity = A.rsub.Scalar(A.mul.Scalar(A.remainder.Scalar(swaps, 2), 2.0), 1)
    sign = A.mul.Tensor(A.prod.dim_int(A.sign.default(diagonal), -1), parity)
    logabsdet = A.sum.dim_IntList(A.log.default(A.abs.default(diagonal)), [-1])
    return _narrow(sign, a), _narrow(logabsdet, a), _narrow(lu, a), pivots


@only_when(lambda a, b, *, upper, left=True, unitriangular=False: _small(a, b))
def _linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    wide = _wide(a)
    if left:
        x = _solve_triangular(wide, _wide(b), lower=not upper, unit=unitriangular)
    else:   # x·A = b: Aᵀ·xᵀ = bᵀ
        x = _transpose(_solve_triangular(_transpose(wide), _transpose(_wide(b)), lower=upper, unit=unitriangular))
    return _narrow(x, b)


@only_when(lambda b, a, upper=True, transpose=False, unitriangular=False: _small(a, b))
def _triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    """(x with op(A)·x = b, a copy of A), op = transpose or not; the batch dims broadcast."""
    t = _transpose(_wide(a)) if transpose else _wide(a)
    x = _solve_triangular(t, _wide(b), lower=upper == transpose, unit=unitriangular)
    shape = list(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])) + list(a.shape[-2:])
    return _narrow(x, b), A.clone.default(A.expand.default(a, shape))


def _cholesky(a):
    """(L, info): the lower Cholesky factor from a's lower triangle (float64), column by column;
    info the first column whose pivot is not positive (NaN from there on)."""
    n = a.shape[-1]
    rows = _index(n, a)
    factor = A.zeros_like.default(a)
    info = A.zeros_like.default(A.select.int(_column(a, 0), -1, 0), dtype=torch.int32)
    for j in range(n):
        row = A.unsqueeze.default(_row(factor, j), -1)                            # L[j, :j] (0 beyond)
        c = A.sub.Tensor(_column(a, j), A.squeeze.dim(A.matmul.default(factor, row), -1))
        d = A.sqrt.default(A.select.int(c, -1, j))
        column = A.where.self(A.gt.Scalar(rows, j), A.div.Tensor(c, A.unsqueeze.default(d, -1)), A.zeros_like.default(c))
        column = A.where.self(A.eq.Scalar(rows, j), A.unsqueeze.default(d, -1), column)
        factor = A.where.self(A.eq.Scalar(rows, j), A.unsqueeze.default(column, -1), factor)   # column j
        failed = A.logical_and.default(A.eq.Scalar(info, 0), A.logical_not.default(A.gt.Scalar(A.select.int(c, -1, j), 0)))
        info = A.where.self(failed, A.full_like.default(info, j + 1), info)
    return factor, info


@only_when(lambda a, *, upper=False, check_errors=False: not check_errors and _small(a))
def _linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    """upper: LAPACK reads the upper triangle and returns U = Lᵀ of the matrix it describes."""
    wide = _wide(a)
    factor, info = _cholesky(_transpose(wide) if upper else wide)
    return _narrow(_transpose(factor) if upper else factor, a), info


def _cholesky_solve_wide(b, factor, upper: bool):
    """x with A·x = b, A = L·Lᵀ (or Uᵀ·U), the factor's triangle only (float64)."""
    lower = _transpose(factor) if upper else factor
    y = _solve_triangular(lower, b, lower=True)
    return _solve_triangular(_transpose(lower), y, lower=False)


@only_when(lambda b, factor, upper=False: _small(b, factor))
def _cholesky_solve(b, factor, upper=False):
    return _narrow(_cholesky_solve_wide(_wide(b), _wide(factor), upper), b)


@only_when(lambda factor, upper=False: _small(factor))
def _cholesky_inverse(factor, upper=False):
    wide = _wide(factor)
    eye = A.add.Tensor(A.eye.default(factor.shape[-1], dtype=torch.float64, device=factor.device), A.zeros_like.default(wide))
    return _narrow(_cholesky_solve_wide(eye, wide, upper), factor)


def _geqrf(a):
    """Householder QR as LAPACK's geqrf (float64): R on and above the diagonal, the reflectors'
    vectors below it (their leading 1 implicit), tau [..., min(m, n)]. slarfg's conventions:
    beta = -sign(alpha)·‖x‖, tau = (beta - alpha)/beta, v = x/(alpha - beta), and tau = 0 (no
    reflection) where the part below the diagonal is 0."""
    m, n = a.shape[-2], a.shape[-1]
    rows, cols = _index(m, a), _index(n, a)
    taus = []
    for k in range(min(m, n)):
        x = _column(a, k)
        alpha = A.select.int(x, -1, k)
        below = A.gt.Scalar(rows, k)
        tail = A.where.self(below, x, A.zeros_like.default(x))
        tail_norm = A.sqrt.default(A.sum.dim_IntList(A.mul.Tensor(tail, tail), [-1]))
        norm = A.sqrt.default(A.add.Tensor(A.mul.Tensor(alpha, alpha), A.mul.Tensor(tail_norm, tail_norm)))
        beta = A.where.self(A.ge.Scalar(alpha, 0), A.neg.default(norm), norm)
        reflect = A.ne.Scalar(tail_norm, 0)
        beta = A.where.self(reflect, beta, alpha)
        safe_beta = A.where.self(reflect, beta, A.ones_like.default(beta))
        tau = A.where.self(reflect, A.div.Tensor(A.sub.Tensor(beta, alpha), safe_beta), A.zeros_like.default(beta))
        scale = A.where.self(reflect, A.sub.Tensor(alpha, beta), A.ones_like.default(beta))
        v = A.where.self(below, A.div.Tensor(tail, A.unsqueeze.default(scale, -1)),
                         A._to_copy.default(A.eq.Scalar(rows, k), dtype=a.dtype))
        v = A.where.self(A.lt.Scalar(rows, k), A.zeros_like.default(v), v)
        a = _reflect_left(a, v, tau, A.gt.Scalar(cols, k))
        column = A.where.self(below, v, A.where.self(A.eq.Scalar(rows, k), A.unsqueeze.default(beta, -1), x))
        a = A.where.self(A.eq.Scalar(cols, k), A.unsqueeze.default(column, -1), a)
        taus.append(A.unsqueeze.default(tau, -1))
    return a, A.cat.default(taus, -1) if taus else A.zeros_like.default(A.slice.Tensor(_row(a, 0), -1, 0, 0))


def _reflect_left(c, v, tau, columns=None):
    """(I - tau·v·vᵀ)·c, on the given columns of c only (all by default)."""
    w = A.matmul.default(A.unsqueeze.default(v, -2), c)                      # vᵀ c: [..., 1, n]
    update = A.mul.Tensor(A.mul.Tensor(A.unsqueeze.default(v, -1), w), A.unsqueeze.default(A.unsqueeze.default(tau, -1), -1))
    reflected = A.sub.Tensor(c, update)
    return reflected if columns is None else A.where.self(A.unsqueeze.default(columns, 0), reflected, c)


def _reflector(v_matrix, k: int):
    """The k-th Householder vector stored in column k below the diagonal (1 on it, 0 above)."""
    m = v_matrix.shape[-2]
    rows = _index(m, v_matrix)
    x = _column(v_matrix, k)
    v = A.where.self(A.gt.Scalar(rows, k), x, A.zeros_like.default(x))
    return A.where.self(A.eq.Scalar(rows, k), A.ones_like.default(x), v)


def _apply_reflectors(v_matrix, tau, c, left: bool, transpose: bool):
    """Q·c, Qᵀ·c, c·Q or c·Qᵀ for Q = H_0 H_1 ... H_(k-1), H_i = I - tau_i v_i v_iᵀ (float64)."""
    k = tau.shape[-1]
    first_to_last = left == transpose   # Qᵀ·c and c·Q apply H_0 first
    for i in (range(k) if first_to_last else reversed(range(k))):
        v, t = _reflector(v_matrix, i), A.select.int(tau, -1, i)
        c = _reflect_left(c, v, t) if left else _transpose(_reflect_left(_transpose(c), v, t))
    return c


@only_when(lambda a: _small(a))
def _geqrf_decomposition(a):
    packed, tau = _geqrf(_wide(a))
    return _narrow(packed, a), _narrow(tau, a)


def _identity_columns(m: int, n: int, like):
    """The first n columns of the m×m identity, with like's batch dims (float64)."""
    eye = A.eye.m(m, n, dtype=torch.float64, device=like.device)
    return A.add.Tensor(eye, A.zeros_like.default(A.slice.Tensor(A.slice.Tensor(like, -1, 0, 1), -2, 0, 1)))


@only_when(lambda v, tau: _small(v))
def _householder_product(v, tau):
    """The first n columns of H_0 ... H_(k-1) (LAPACK's orgqr)."""
    wide = _wide(v)
    q = _apply_reflectors(wide, _wide(tau), _identity_columns(v.shape[-2], v.shape[-1], wide), left=True, transpose=False)
    return _narrow(q, v)


@only_when(lambda a, tau, c, left=True, transpose=False: _small(a, c))
def _ormqr(a, tau, c, left=True, transpose=False):
    return _narrow(_apply_reflectors(_wide(a), _wide(tau), _wide(c), left=left, transpose=transpose), c)


@only_when(lambda a, mode="reduced": _small(a) and mode in ("reduced", "complete", "r"))
def _linalg_qr(a, mode="reduced"):
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    packed, tau = _geqrf(_wide(a))
    rows = k if mode in ("reduced", "r") else m
    r = _triangle(A.slice.Tensor(packed, -2, 0, rows), lower=False)
    if mode == "r":
        return A.new_zeros.default(a, [0]), _narrow(r, a)
    columns = k if mode == "reduced" else m
    q = _apply_reflectors(packed, tau, _identity_columns(m, columns, packed), left=True, transpose=False)
    return _narrow(q, a), _narrow(r, a)


# Symmetric eigenvalues by Jacobi rotations in float64, n/2 disjoint rotations at a time (the
# round-robin ordering: n - 1 rounds a sweep, a zero row and column added to an odd n, which no
# rotation touches since its off-diagonal stays 0). Quadratic convergence; measured on random,
# graded (1e-6..1e6) and clustered spectra in float64, the eigenvalues within 3e-15 of LAPACK's
# after 6 sweeps for n = 5 and 7 for n = 8: one more is run. A round is ~30 ops, so the graph
# grows as n² (rounds × sweeps): Jacobi is unrolled up to MAX_JACOBI.
MAX_JACOBI = 8


def _jacobi_sweeps(n: int) -> int:
    return 4 if n <= 3 else 7 if n <= 5 else 8


def _round_robin(n: int) -> list[list[tuple[int, int]]]:
    """n - 1 rounds of n/2 disjoint pairs (n even) covering every pair once: the circle method."""
    players = list(range(n))
    rounds = []
    for _ in range(n - 1):
        rounds.append([tuple(sorted((players[i], players[n - 1 - i]))) for i in range(n // 2)])
        players = [players[0], players[-1]] + players[1:-1]
    return rounds


def _jacobi(s, vectors: bool):
    """(eigenvalues [..., n] unsorted, eigenvectors [..., n, n] or None) of symmetric s (float64)."""
    n = s.shape[-1]
    even = n + n % 2
    if even != n:   # a zero row and column, dropped at the end
        s = A.constant_pad_nd.default(s, [0, 1, 0, 1], 0.0)
    eye = A.add.Tensor(A.eye.default(even, dtype=torch.float64, device=s.device), A.zeros_like.default(s))
    v = eye if vectors else None
    rounds = [_round_indices(pairs, even, s) for pairs in _round_robin(even)]
    for _ in range(_jacobi_sweeps(n)):
        for indices in rounds:
            rotation = _rotation(s, even, *indices)
            s = A.matmul.default(A.matmul.default(_transpose(rotation), s), rotation)
            v = A.matmul.default(v, rotation) if vectors else None
    values = A.slice.Tensor(A.diagonal.default(s, 0, -2, -1), -1, 0, n)
    return values, A.slice.Tensor(A.slice.Tensor(v, -1, 0, n), -2, 0, n) if vectors else None


def _round_indices(pairs, n: int, like):
    """Constant indices of one round: the flat positions of its (p, p), (q, q), (p, q), (q, p)."""
    ps, qs = [p for p, _ in pairs], [q for _, q in pairs]
    flat = [p * n + p for p in ps] + [q * n + q for q in qs] + [p * n + q for p, q in zip(ps, qs)] + \
           [q * n + p for p, q in zip(ps, qs)]
    return (_constant_indices(flat[:2 * len(ps)], like), _constant_indices(flat[2 * len(ps):3 * len(ps)], like),
            _constant_indices(flat, like))


def _constant_indices(values: list[int], like):
    """An int64 vector of these values, built from arange (decompositions run under fake tensors,
    where torch.tensor of Python values is not traced as a constant)."""
    out = A.zeros.default([len(values)], dtype=torch.int64, device=like.device)
    positions = A.arange.default(len(values), dtype=torch.int64, device=like.device)
    for i, value in enumerate(values):
        if value:
            out = A.where.self(A.eq.Scalar(positions, i), A.full_like.default(out, value), out)
    return out


def _rotation(s, n: int, diagonal_positions, pq_positions, all_positions):
    """The rotations of one round as one matrix: for each pair, t = sign(τ)/(|τ| + √(1 + τ²)),
    τ = (s_qq - s_pp)/(2 s_pq), the identity where s_pq is already 0; c = 1/√(1 + t²) on (p, p)
    and (q, q), t·c on (p, q), -t·c on (q, p)."""
    flat = A.reshape.default(s, list(s.shape[:-2]) + [n * n])
    diagonal = A.index_select.default(flat, -1, diagonal_positions)
    half = n // 2
    spp, sqq = A.slice.Tensor(diagonal, -1, 0, half), A.slice.Tensor(diagonal, -1, half, n)
    spq = A.index_select.default(flat, -1, pq_positions)
    zero = A.eq.Scalar(spq, 0)
    tau = A.div.Tensor(A.sub.Tensor(sqq, spp), A.mul.Scalar(A.where.self(zero, A.ones_like.default(spq), spq), 2.0))
    magnitude = A.add.Tensor(A.abs.default(tau), A.sqrt.default(A.add.Scalar(A.mul.Tensor(tau, tau), 1)))
    t = A.div.Tensor(A.where.self(A.ge.Scalar(tau, 0), A.ones_like.default(tau), A.full_like.default(tau, -1.0)), magnitude)
    t = A.where.self(zero, A.zeros_like.default(t), t)
    c = A.rsqrt.default(A.add.Scalar(A.mul.Tensor(t, t), 1))
    sine = A.mul.Tensor(t, c)
    values = A.cat.default([c, c, sine, A.neg.default(sine)], -1)
    g = A.zeros_like.default(flat)
    index = A.expand.default(all_positions, list(values.shape))
    g = A.scatter.src(g, -1, index, values)
    return A.reshape.default(g, list(s.shape))


def _symmetric_from(a, uplo: str):
    """The symmetric matrix a's `uplo` triangle describes (eigh reads only that one)."""
    lower = uplo.upper() == "L"
    strict = _triangle(a, lower=lower, unit=False)
    off = _triangle(a, lower=lower, unit=True)
    off = A.sub.Tensor(off, A.add.Tensor(A.eye.default(a.shape[-1], dtype=a.dtype, device=a.device), A.zeros_like.default(a)))
    return A.add.Tensor(strict, _transpose(off))


def _eigvalsh(a, uplo: str = "L"):
    values, _ = _jacobi(_symmetric_from(_wide(a), uplo), vectors=False)
    return A.sort.default(values, -1)[0]


def _gram(a):
    """(aᵀa or aaᵀ, whichever is smaller) in float64: its eigenvalues are the squared singular values."""
    wide = _wide(a)
    return A.matmul.default(_transpose(wide), wide) if a.shape[-2] >= a.shape[-1] else A.matmul.default(wide, _transpose(wide))


def _singular_values(a):
    """Descending, float64: √ of the Gram matrix's eigenvalues (clamped at 0). Squaring costs
    small singular values their digits below 1e-8·σmax, float32's own noise level being 6e-8."""
    values, _ = _jacobi(_gram(a), vectors=False)
    return A.sqrt.default(A.clamp_min.default(A.sort.default(values, -1, True)[0], 0))


def _jacobi_sized(a, *, square: bool = False) -> bool:
    return _small(a) and min(a.shape[-2:]) <= MAX_JACOBI and a.numel() > 0 and (not square or a.shape[-1] == a.shape[-2])


@only_when(lambda a, uplo="L", compute_v=True: not compute_v and _jacobi_sized(a, square=True))
def _linalg_eigh(a, uplo="L", compute_v=True):
    return _narrow(_eigvalsh(a, uplo), a), A.new_zeros.default(a, [0])


@only_when(lambda a, full_matrices=False, compute_uv=True, *, driver=None: not compute_uv and _jacobi_sized(a))
def _linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    empty = A.new_zeros.default(a, [0])
    return empty, _narrow(_singular_values(a), a), empty


def _tolerance(largest, a, atol, rtol):
    """max(atol, rtol·σmax) by torch's rule (get_atol_rtol): atol 0 when not given; rtol, when not
    given, eps·max(m, n), or 0 where atol > 0. largest: [..., 1] (float64)."""
    def column(t):   # a tolerance per matrix, [..., 1]
        return A.unsqueeze.default(_wide(t), -1) if isinstance(t, torch.Tensor) else A.full_like.default(largest, t)
    default = torch.finfo(a.dtype).eps * max(a.shape[-2:])
    if rtol is None:
        if atol is None:
            rtol = default
        elif isinstance(atol, torch.Tensor):
            rtol = A.where.self(A.gt.Scalar(atol, 0), A.zeros_like.default(_wide(atol)), A.full_like.default(_wide(atol), default))
        else:
            rtol = 0.0 if atol > 0 else default
    relative = A.mul.Tensor(column(rtol), largest)
    return relative if atol is None else A.maximum.default(column(atol), relative)


def _magnitudes(a, hermitian: bool):
    """Singular values (|eigenvalues| of the matrix a's lower triangle describes, when
    hermitian), unsorted, float64."""
    if hermitian:
        return A.abs.default(_jacobi(_symmetric_from(_wide(a), "L"), vectors=False)[0])
    return A.sqrt.default(A.clamp_min.default(_jacobi(_gram(a), vectors=False)[0], 0))


def _rank(a, atol, rtol, hermitian: bool):
    """linalg.matrix_rank: how many singular values exceed the tolerance."""
    magnitude = _magnitudes(a, hermitian)
    tolerance = _tolerance(A.amax.default(magnitude, [-1], True), a, atol, rtol)
    return A.sum.dim_IntList(A._to_copy.default(A.gt.Tensor(magnitude, tolerance), dtype=torch.int64), [-1])


@only_when(lambda a, *, atol=None, rtol=None, hermitian=False: _jacobi_sized(a, square=hermitian), otherwise_torch=True)
def _matrix_rank(a, *, atol=None, rtol=None, hermitian=False):
    return _rank(a, atol, rtol, hermitian)


@only_when(lambda a, tol, hermitian=False: _jacobi_sized(a, square=hermitian), otherwise_torch=True)
def _matrix_rank_tol(a, tol, hermitian=False):
    return _rank(a, tol, 0.0, hermitian)


@only_when(lambda a, uplo="L": _jacobi_sized(a, square=True), otherwise_torch=True)
def _linalg_eigvalsh(a, uplo="L"):
    return _narrow(_eigvalsh(a, uplo), a)


@only_when(lambda a, *, driver=None: _jacobi_sized(a), otherwise_torch=True)
def _linalg_svdvals(a, *, driver=None):
    return _narrow(_singular_values(a), a)


@only_when(lambda a, p=None: p in (None, 2, -2) and _jacobi_sized(a, square=True), otherwise_torch=True)
def _linalg_cond(a, p=None):
    """κ₂ = σmax/σmin (p = -2: its inverse); inf for a singular matrix, as eager."""
    values = _singular_values(a)
    largest, smallest = A.select.int(values, -1, 0), A.select.int(values, -1, -1)
    ratio = A.div.Tensor(smallest, largest) if p == -2 else A.div.Tensor(largest, smallest)
    return _narrow(ratio, a)


def _spectral_norm_applies(a, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None) -> bool:
    return ord in (2, -2, "nuc") and len(dim) == 2 and _jacobi_sized(_as_matrices(a, dim))


def _as_matrices(a, dim):
    """a with the two matrix dims last (rows, columns)."""
    rows, cols = (d % a.dim() for d in dim)
    rest = [d for d in range(a.dim()) if d not in (rows, cols)]
    return A.permute.default(a, rest + [rows, cols])


@only_when(_spectral_norm_applies, otherwise_torch=True)
def _matrix_norm(a, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None):
    """The norms from singular values: 2 (σmax), -2 (σmin), "nuc" (their sum)."""
    x = a if dtype is None else A._to_copy.default(a, dtype=dtype)
    values = _singular_values(_as_matrices(x, dim))
    norm = {2: lambda: A.select.int(values, -1, 0), -2: lambda: A.select.int(values, -1, -1),
            "nuc": lambda: A.sum.dim_IntList(values, [-1])}[ord]()
    if keepdim:
        for d in sorted(d % a.dim() for d in dim):
            norm = A.unsqueeze.default(norm, d)
    return _narrow(norm, x)


@only_when(lambda a, *, atol=None, rtol=None, hermitian=False: _jacobi_sized(a, square=hermitian))
def _linalg_pinv(a, *, atol=None, rtol=None, hermitian=False):
    """The pseudo-inverse from eigenvectors, which is unique whatever their signs: Σ over the
    kept σ_i > tol of v_i v_iᵀ / σ_i² · aᵀ (Gram aᵀa; a tall or square), of its transpose for a
    wide a; hermitian: Σ over |λ_i| > tol of u_i u_iᵀ / λ_i (reading the lower triangle)."""
    wide = _wide(a)
    if hermitian:
        values, vectors = _jacobi(_symmetric_from(wide, "L"), vectors=True)
        magnitude = A.abs.default(values)
    else:
        tall = a.shape[-2] >= a.shape[-1]
        values, vectors = _jacobi(_gram(a), vectors=True)
        magnitude = A.sqrt.default(A.clamp_min.default(values, 0))
    largest = A.amax.default(magnitude, [-1], True)
    kept = A.gt.Tensor(magnitude, _tolerance(largest, a, atol, rtol))
    safe = A.where.self(kept, values, A.ones_like.default(values))
    weights = A.where.self(kept, A.reciprocal.default(safe), A.zeros_like.default(values))
    core = A.matmul.default(A.mul.Tensor(vectors, A.unsqueeze.default(weights, -2)), _transpose(vectors))
    if hermitian:
        return _narrow(core, a)
    result = A.matmul.default(core, _transpose(wide)) if tall else _transpose(A.matmul.default(core, wide))
    return _narrow(result, a)


DECOMPOSITIONS = {
    A.linalg_lu_factor_ex.default: _linalg_lu_factor_ex,
    A.linalg_lu.default: _linalg_lu,
    A.lu_unpack.default: _lu_unpack,
    A.linalg_lu_solve.default: _linalg_lu_solve,
    A._linalg_solve_ex.default: _linalg_solve_ex,
    A.linalg_inv_ex.default: _linalg_inv_ex,
    A._linalg_slogdet.default: _linalg_slogdet,
    A.linalg_solve_triangular.default: _linalg_solve_triangular,
    A.triangular_solve.default: _triangular_solve,
    A.linalg_cholesky_ex.default: _linalg_cholesky_ex,
    A.cholesky_solve.default: _cholesky_solve,
    A.cholesky_inverse.default: _cholesky_inverse,
    A.geqrf.default: _geqrf_decomposition,
    A.linalg_householder_product.default: _householder_product,
    A.ormqr.default: _ormqr,
    A.linalg_qr.default: _linalg_qr,
    A._linalg_eigh.default: _linalg_eigh,
    A._linalg_svd.default: _linalg_svd,
    A.linalg_pinv.atol_rtol_tensor: _linalg_pinv,
    A.linalg_eigvalsh.default: _linalg_eigvalsh,
    A.linalg_svdvals.default: _linalg_svdvals,
    A.linalg_matrix_rank.atol_rtol_tensor: _matrix_rank,
    A.linalg_matrix_rank.atol_rtol_float: _matrix_rank,
    A.linalg_matrix_rank.default: _matrix_rank_tol,
    A.linalg_matrix_rank.tol_tensor: _matrix_rank_tol,
    A.linalg_cond.default: _linalg_cond,
    A.linalg_matrix_norm.default: _matrix_norm,
    A.linalg_matrix_norm.str_ord: _matrix_norm,
}
