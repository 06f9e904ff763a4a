"""Histograms and consecutive runs for ONNX Runtime, written in ATen ops torchlib translates:
histc, histogram (a bin count or explicit edges) and unique_consecutive of floats. torchlib
translates histc only with a fixed range and unique_consecutive only for int32 / int64, and has
no histogram (OpInfo: histc, histogram, unique_consecutive ran in PyTorch).

Eager's arithmetic is kept where it decides a bin: histc's bin is
int((x - lo) * bins / (hi - lo)) in the input's dtype (the last edge in the last bin), an
element outside [lo, hi] or NaN is not counted, and a range from the data (min == max) that is
one value widens to [lo - 1, hi + 1]. histogram's edges are linspace(lo, hi, bins + 1); an
element goes to the bin whose edges hold it (eager's local search around the same
interpolation); explicit edges are searched. Counts are summed with ScatterElements (add).
The edges come from torch.linspace's formula, but eager's vectorized kernel rounds some of them
one ulp apart (measured: 11 bins over the data's range, 2.4e-7 on edges near 3), so an element
within an ulp of such an edge may be counted in the neighbouring bin; 300 random cases
(counts, densities, weights, data and fixed ranges, explicit edges) matched eager's counts.
"""
from __future__ import annotations

import builtins

import torch

from .conditional import only_when, static

builtins_range = builtins.range   # `range` is an argument name below

A = torch.ops.aten


def _nonempty(x, *args, **kwargs) -> bool:
    return static(*x.shape) and x.numel() > 0 and x.dtype.is_floating_point


def _data_range(flat, lo: float, hi: float, widen: float = 1.0):
    """(lo, hi) as 0-d tensors of flat's dtype: the data's min and max when lo == hi; a range of
    one value widened by `widen` each way (histc 1, histogram 0.5), as eager."""
    if lo != hi:
        full = lambda v: A.full.default([], v, dtype=flat.dtype)
        return full(lo), full(hi)
    low, high = A.amin.default(flat, [0]), A.amax.default(flat, [0])
    same = A.eq.Tensor(low, high)
    return A.where.self(same, A.sub.Scalar(low, widen), low), A.where.self(same, A.add.Scalar(high, widen), high)


def _counted(bin_index, counted, weights, bins: int, dtype):
    """Sum of weights (1 where None) per bin over the counted elements."""
    ones = A.ones_like.default(bin_index, dtype=dtype) if weights is None else weights
    values = A.where.self(counted, ones, A.zeros_like.default(ones))
    index = A.where.self(counted, bin_index, A.zeros_like.default(bin_index))
    return A.scatter_add.default(A.zeros.default([bins], dtype=dtype), 0, index, values)


def _linear_bin(flat, low, high, bins: int):
    """int((x - lo) * bins / (hi - lo)), the last edge in the last bin, and whether x is counted."""
    scaled = A.div.Tensor(A.mul.Tensor(A.sub.Tensor(flat, low), A.full.default([], float(bins), dtype=flat.dtype)),
                          A.sub.Tensor(high, low))
    counted = A.logical_and.default(A.ge.Tensor(flat, low), A.le.Tensor(flat, high))   # NaN: neither
    safe = A.where.self(counted, scaled, A.zeros_like.default(scaled))
    index = A.clamp_max.default(A._to_copy.default(safe, dtype=torch.int64), bins - 1)
    return index, counted


@only_when(_nonempty)
def histc(x, bins=100, min=0, max=0):
    flat = A.reshape.default(x, [-1])
    low, high = _data_range(flat, float(min), float(max))
    index, counted = _linear_bin(flat, low, high, bins)
    return _counted(index, counted, None, bins, x.dtype)


def _linspace(low, high, steps: int):
    """torch.linspace's own arithmetic (from the start below halfway, from the end above), so
    the edges are eager's to the bit."""
    step = A.div.Scalar(A.sub.Tensor(high, low), steps - 1)
    i = A.arange.default(steps, dtype=low.dtype)
    from_start = A.add.Tensor(low, A.mul.Tensor(step, i))
    from_end = A.sub.Tensor(high, A.mul.Tensor(step, A.rsub.Scalar(i, steps - 1)))
    return A.where.self(A.lt.Scalar(i, steps // 2), from_start, from_end)


def _density(hist, edges):
    widths = A.sub.Tensor(A.slice.Tensor(edges, 0, 1, None), A.slice.Tensor(edges, 0, 0, -1))
    return A.div.Tensor(hist, A.mul.Tensor(A.sum.default(hist), widths))


def _weights_ok(x, bins, *, range=None, weight=None, density=False) -> bool:
    return _nonempty(x) and (weight is None or weight.shape == x.shape)


@only_when(_weights_ok)
def histogram_bin_count(x, bins=100, *, range=None, weight=None, density=False):
    """bins equal bins over `range` (the data's when None): the linear bin, then moved to the
    neighbour whose edges hold x, as eager's local search does (x on an edge goes right)."""
    flat = A.reshape.default(x, [-1])
    lo, hi = (0.0, 0.0) if range is None else (float(range[0]), float(range[1]))
    low, high = _data_range(flat, lo, hi, 0.5)
    edges = _linspace(low, high, bins + 1)
    index, counted = _bin_by_interpolation(flat, low, high, edges, bins)
    weights = None if weight is None else A.reshape.default(weight, [-1])
    hist = _counted(index, counted, weights, bins, x.dtype)
    return (_density(hist, edges) if density else hist), edges


@only_when(lambda x, bins, **kwargs: _weights_ok(x, bins, **kwargs) and bins.dim() == 1 and static(*bins.shape)
           and bins.shape[0] >= 2)
def histogram_edges(x, bins, *, weight=None, density=False):
    """explicit increasing edges: the bin is the count of edges <= x, less one (the last edge in
    the last bin); outside [first, last] or NaN not counted."""
    from .decompositions import _searchsorted
    flat = A.reshape.default(x, [-1])
    n = bins.shape[0] - 1
    first, last = A.select.int(bins, 0, 0), A.select.int(bins, 0, n)
    counted = A.logical_and.default(A.ge.Tensor(flat, first), A.le.Tensor(flat, last))
    index = A.clamp.default(A.sub.Scalar(_searchsorted(bins, flat, right=True), 1), 0, n - 1)
    weights = None if weight is None else A.reshape.default(weight, [-1])
    hist = _counted(index, counted, weights, n, x.dtype)
    return (_density(hist, bins) if density else hist), A.clone.default(bins)


def _upper_bound(edges, values):
    """std::upper_bound over `edges` for every value, step for step (unrolled over the static
    length): eager's binary search, also on edges that are not sorted (OpInfo's histogramdd
    samples draw them at random)."""
    n = edges.shape[0]
    first = A.zeros_like.default(values, dtype=torch.int64)
    count = A.full_like.default(first, n)
    for _ in range(max(n, 1).bit_length() + 1):
        step = A.floor_divide.Scalar(count, 2)
        at = A.add.Tensor(first, step)
        pivot = A.index.Tensor(edges, [A.clamp.default(at, 0, n - 1)])
        active = A.gt.Scalar(count, 0)
        right = A.logical_and.default(active, A.logical_not.default(A.lt.Tensor(values, pivot)))
        left = A.logical_and.default(active, A.logical_not.default(right))
        first = A.where.self(right, A.add.Scalar(at, 1), first)
        count = A.where.self(right, A.sub.Tensor(A.sub.Tensor(count, step), A.ones_like.default(count)),
                             A.where.self(left, step, count))
    return first


def _bin_by_search(values, edges):
    """eager's BINARY_SEARCH bin: upper_bound - 1, the last edge in the last bin; counted where
    first edge <= value <= last edge (NaN not)."""
    n = edges.shape[0] - 1
    first, last = A.select.int(edges, 0, 0), A.select.int(edges, 0, n)
    counted = A.logical_and.default(A.ge.Tensor(values, first), A.le.Tensor(values, last))
    index = A.sub.Scalar(_upper_bound(edges, values), 1)
    index = A.where.self(A.eq.Scalar(index, n), A.full_like.default(index, n - 1), index)
    return A.clamp.default(index, 0, n - 1), counted


def _bin_by_interpolation(values, low, high, edges, bins: int):
    """eager's LINEAR_INTERPOLATION_WITH_LOCAL_SEARCH bin: the linear bin, then moved to the
    neighbour whose edges hold the value (a value on an edge goes right)."""
    index, counted = _linear_bin(values, low, high, bins)
    left = A.index.Tensor(edges, [index])
    right = A.index.Tensor(edges, [A.add.Scalar(index, 1)])
    index = A.where.self(A.lt.Tensor(values, left), A.clamp_min.default(A.sub.Scalar(index, 1), 0), index)
    last = A.eq.Scalar(index, bins - 1)
    index = A.where.self(A.logical_and.default(A.ge.Tensor(values, right), A.logical_not.default(last)),
                         A.add.Scalar(index, 1), index)
    return index, counted


def _histogramdd(x, per_dim, weight, density: bool, edges_list):
    """Counts over the flattened bins (row-major over the dims) of the elements every dim
    counts; `per_dim[d]` is (bin index, counted) of column d."""
    d = x.shape[-1]
    sizes = [e.shape[0] - 1 for e in edges_list]
    flat = A.zeros_like.default(per_dim[0][0])
    counted = A.ones_like.default(per_dim[0][1])
    for k in range(d):
        flat = A.add.Tensor(A.mul.Scalar(flat, sizes[k]), per_dim[k][0])
        counted = A.logical_and.default(counted, per_dim[k][1])
    total_bins = 1
    for size in sizes:
        total_bins *= size
    weights = None if weight is None else A.reshape.default(weight, [-1])
    hist = A.reshape.default(_counted(flat, counted, weights, total_bins, x.dtype), sizes)
    if density:
        hist = A.div.Tensor(hist, A.sum.default(hist))
        for k, e in enumerate(edges_list):
            shape = [1] * d
            shape[k] = sizes[k]
            widths = A.sub.Tensor(A.slice.Tensor(e, 0, 1, None), A.slice.Tensor(e, 0, 0, -1))
            hist = A.div.Tensor(hist, A.reshape.default(widths, shape))
    return hist, [A.clone.default(e) for e in edges_list]


def _dd_ok(x, bins, range=None, weight=None, density=False) -> bool:
    return _nonempty(x) and x.dim() >= 2 and static(*x.shape) and (weight is None or static(*weight.shape))


@only_when(_dd_ok)
def histogramdd_edges(x, bins, range=None, weight=None, density=False):
    """histogramdd with an edge tensor per dim (TensorList_bins): eager's binary search."""
    rows = A.reshape.default(x, [-1, x.shape[-1]])
    columns = [A.select.int(rows, 1, k) for k in builtins_range(x.shape[-1])]
    per_dim = [_bin_by_search(c, e) for c, e in zip(columns, bins)]
    return _histogramdd(x, per_dim, weight, density, list(bins))


@only_when(_dd_ok)
def histogramdd_counts(x, bins, range=None, weight=None, density=False):
    """histogramdd with a bin count per dim (or one for all): linspace edges over `range` (the
    data's per dim when None, one value widened by 0.5), eager's interpolation with local search."""
    d = x.shape[-1]
    counts = [bins] * d if isinstance(bins, int) else list(bins)
    rows = A.reshape.default(x, [-1, d])
    per_dim, edges_list = [], []
    for k in builtins_range(d):
        column = A.select.int(rows, 1, k)
        lo, hi = (0.0, 0.0) if range is None else (float(range[2 * k]), float(range[2 * k + 1]))
        low, high = _data_range(column, lo, hi, 0.5)
        edges = _linspace(low, high, counts[k] + 1)
        per_dim.append(_bin_by_interpolation(column, low, high, edges, counts[k]))
        edges_list.append(edges)
    return _histogramdd(x, per_dim, weight, density, edges_list)


@only_when(lambda x, return_inverse=False, return_counts=False, dim=None:
           dim is None and static(*x.shape) and x.numel() > 0)
def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    """The first value of each run of equal values (NaN never equals: each its own run), the
    run number of every element, each run's length; (0,) where not asked for, as eager."""
    flat = A.reshape.default(x, [-1])
    n = flat.shape[0]
    first = A.full.default([1], True, dtype=torch.bool)
    starts = A.cat.default([first, A.ne.Tensor(A.slice.Tensor(flat, 0, 1, n), A.slice.Tensor(flat, 0, 0, n - 1))])
    at = A.squeeze.dim(A.nonzero.default(starts), 1)
    values = A.index.Tensor(flat, [at])
    nothing = A.zeros.default([0], dtype=torch.int64)
    inverse = nothing
    if return_inverse:
        run = A.sub.Scalar(A.cumsum.default(A._to_copy.default(starts, dtype=torch.int64), 0), 1)
        inverse = A.reshape.default(run, list(x.shape))
    counts = nothing
    if return_counts:
        ends = A.cat.default([A.slice.Tensor(at, 0, 1, None), A.full.default([1], n, dtype=torch.int64)])
        counts = A.sub.Tensor(ends, at)
    return values, inverse, counts


DECOMPOSITIONS = {
    A.histogramdd.default: histogramdd_counts,
    A.histogramdd.int_bins: histogramdd_counts,
    A.histogramdd.TensorList_bins: histogramdd_edges,
    A.histc.default: histc,
    A.histogram.bin_ct: histogram_bin_count,
    A.histogram.bins_tensor: histogram_edges,
    A.unique_consecutive.default: unique_consecutive,
}
