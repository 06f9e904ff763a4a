"""Order statistics for ONNX Runtime, written in ATen ops torchlib translates: median,
nanmedian, kthvalue (a position in the stable sort of decompositions._sort, which orders NaN
last as eager does) and mode (runs of equal values in that sort, counted). torchlib has no
translation for any of them (OpInfo: median, nanmedian, masked.median, kthvalue, mode ran in PyTorch).

Values are eager's, NaN included: median is NaN where its row holds one (at that NaN's index,
the first), nanmedian ignores NaN (NaN, index 0, where the row is all NaN), kthvalue counts NaN
as the largest. Indices: a position holding the value; where several do, eager's pick is its
selection algorithm's (libstdc++ nth_element: [3, 1, 2, 1, 5, 1].median(0) gives index 5,
.kthvalue(2, 0) index 3), which torch documents as unspecified — ours is the tie's place in a
stable sort. mode picks the smallest of the most frequent values and its last index, as eager
does on NaN-free rows (eager's mode of a row with NaN depends on its sort's handling of NaN
and is not reproduced; a NaN input runs its call in PyTorch anyway, `clusters.nonfinite`).
The dim must be static and non-empty; other calls stay in PyTorch with their reason.
"""
from __future__ import annotations

import torch

from .conditional import only_when, static

A = torch.ops.aten


def _nonempty_static_dim(x, dim=-1, *args, **kwargs) -> bool:
    return x.dim() == 0 or (static(x.shape[dim % x.dim()]) and x.shape[dim % x.dim()] > 0)


def _nonempty_static(x, *args, **kwargs) -> bool:
    return static(*x.shape) and x.numel() > 0


def _sorted(x, dim: int):
    from .decompositions import _sort
    return _sort(x, dim, False)


def _at(values, order, dim: int, position, keepdim: bool):
    """values / order at `position` (a per-row index tensor with `dim` kept) along dim."""
    value = A.gather.default(values, dim, position)
    index = A.gather.default(order, dim, position)
    if not keepdim:
        value, index = A.squeeze.dim(value, dim), A.squeeze.dim(index, dim)
    return value, index


def _nan_count(x, dim: int):
    if not x.dtype.is_floating_point:
        return A.zeros_like.default(A.sum.dim_IntList(A._to_copy.default(x, dtype=torch.int64), [dim], True))
    return A.sum.dim_IntList(A._to_copy.default(A.isnan.default(x), dtype=torch.int64), [dim], True)


def _of_a_scalar(x):
    return A.clone.default(x), A.full.default([], 0, dtype=torch.int64)


@only_when(_nonempty_static_dim)
def median_dim(x, dim=-1, keepdim=False):
    """The lower median ((n - 1) // 2 in sorted order); NaN at the first NaN's index where the
    row holds one (the stable sort puts it first among the NaNs, at n - count)."""
    if x.dim() == 0:
        return _of_a_scalar(x)
    dim = dim % x.dim()
    n = x.shape[dim]
    values, order = _sorted(x, dim)
    nans = _nan_count(x, dim)
    middle = A.full_like.default(nans, (n - 1) // 2)
    position = A.where.self(A.gt.Scalar(nans, 0), A.rsub.Scalar(nans, n), middle)
    return _at(values, order, dim, position, keepdim)


@only_when(_nonempty_static_dim)
def nanmedian_dim(x, dim=-1, keepdim=False):
    """The lower median of the row's numbers; NaN (index 0, as eager) where all are NaN."""
    if x.dim() == 0:
        return _of_a_scalar(x)
    dim = dim % x.dim()
    n = x.shape[dim]
    values, order = _sorted(x, dim)
    numbers = A.rsub.Scalar(_nan_count(x, dim), n)
    position = A.floor_divide.default(A.clamp_min.default(A.sub.Scalar(numbers, 1), 0), 2)
    value, index = _at(values, order, dim, position, True)
    index = A.where.self(A.eq.Scalar(numbers, 0), A.zeros_like.default(index), index)
    if not keepdim:
        value, index = A.squeeze.dim(value, dim), A.squeeze.dim(index, dim)
    return value, index


@only_when(_nonempty_static)
def median(x):
    """median() of every element: the flattened tensor's median value."""
    return median_dim(A.reshape.default(x, [-1]), 0)[0]


@only_when(_nonempty_static)
def nanmedian(x):
    return nanmedian_dim(A.reshape.default(x, [-1]), 0)[0]


def _kth_in_range(x, k, dim=-1, keepdim=False) -> bool:
    if x.dim() == 0:
        return k == 1
    return _nonempty_static_dim(x, dim) and 1 <= k <= x.shape[dim % x.dim()]


@only_when(_kth_in_range)
def kthvalue(x, k, dim=-1, keepdim=False):
    """The k-th smallest (1-based), NaN counted as the largest."""
    if x.dim() == 0:
        return _of_a_scalar(x)
    dim = dim % x.dim()
    values, order = _sorted(x, dim)
    position = A.full_like.default(_nan_count(x, dim), k - 1)
    return _at(values, order, dim, position, keepdim)


@only_when(_nonempty_static_dim)
def mode(x, dim=-1, keepdim=False):
    """The smallest of the most frequent values, at its last index, from the stable sort: runs
    of equal values counted (ScatterElements add), the first run of the largest count taken (the
    smallest value), the last of its positions (its largest index), the value read there (eager's
    signed zero). Eager sorts a row of more than 16 with std::sort, which does not keep equal
    values in index order: there its index among a mode's positions is the sort's (measured:
    2339 where ours is 2996, the last), a value equal to ours. Linear in memory: OpInfo's
    3000-long sample took 72 MB as pairwise equalities."""
    if x.dim() == 0:
        return _of_a_scalar(x)
    if x.dtype is torch.bool:   # ONNX Runtime has no Where for bool
        value, index = mode(A._to_copy.default(x, dtype=torch.uint8), dim, keepdim)
        return A._to_copy.default(value, dtype=torch.bool), index
    dim = dim % x.dim()
    moved = A.transpose.int(x, dim, -1)
    values, order = _sorted(moved, -1)
    n = values.shape[-1]
    starts = A.ne.Tensor(A.slice.Tensor(values, -1, 1, n), A.slice.Tensor(values, -1, 0, n - 1))
    first = A.full.default(list(values.shape[:-1]) + [1], True, dtype=torch.bool)
    run = A.sub.Scalar(A.cumsum.default(A._to_copy.default(A.cat.default([first, starts], -1), dtype=torch.int64), -1), 1)
    ones = A.ones_like.default(run)
    counts = A.gather.default(A.scatter_add.default(A.zeros_like.default(run), -1, run, ones), -1, run)
    best = A.amax.default(counts, [-1], True)
    at = A.argmax.default(A._to_copy.default(A.eq.Tensor(counts, best), dtype=torch.int64), -1, True)
    index = A.gather.default(order, -1, A.sub.Scalar(A.add.Tensor(at, best), 1))
    value = A.gather.default(moved, -1, index)   # read at the index: eager's -0.0 or 0.0
    value, index = A.transpose.int(value, dim, -1), A.transpose.int(index, dim, -1)
    if not keepdim:
        value, index = A.squeeze.dim(value, dim), A.squeeze.dim(index, dim)
    return value, index


DECOMPOSITIONS = {
    A.median.dim: median_dim,
    A.median.default: median,
    A.nanmedian.dim: nanmedian_dim,
    A.nanmedian.default: nanmedian,
    A.kthvalue.default: kthvalue,
    A.mode.default: mode,
}
