"""ATen decompositions for ops torch.onnx cannot translate as it stands, written in ATen ops
torchlib translates: entries added to the exporter's own decomposition table
(`translate.exporter_decompositions`), so translation stays torch.onnx's and the capability
check (which decomposes each op with the same table, `capability._decomposition_gap`) accepts
exactly what translates.

Each entry is here because torch's table decomposes the op into a `prims` op torchlib has no
translation for (squeeze.dims -> prims.view_of, fmax -> prims.fmax, hypot -> prims.hypot,
copysign -> prims.signbit, isin -> searchsorted), or has no entry for it at all (sort.stable,
searchsorted, bucketize), measured on PyTorch's OpInfo samples (docs/coverage.md), or because
torchlib's own translation is wrong (signbit: taken out of the ops translated as they stand,
`translate._translated_as_is`), or ONNX Runtime's kernel orders NaN otherwise (sort) or
rejects the translation (pad with mode="circular"). Each keeps
eager's semantics where values are special: NaN (fmax/fmin ignore it, searchsorted orders it
last), infinities (hypot(inf, nan) = inf), signed zeros and NaN signs (copysign reads the sign
bit); tests/test_decompositions.py compares each with eager on those values.
"""
from __future__ import annotations

import math

import torch

A = torch.ops.aten


def _squeeze_dims(x, dims):
    """squeeze.dims: one squeeze.dim per dim of size 1, the highest first (so the others keep
    their index); a dim of another size is left as it is, as eager does. A symbolic dim is not 1
    (torch.export specializes size-1 dims)."""
    rank = max(x.dim(), 1)
    wanted = sorted({d % rank for d in dims if x.dim() == 0 or _is_one(x.shape[d % rank])}, reverse=True)
    if not wanted:
        return A.alias.default(x)
    for d in wanted:
        x = A.squeeze.dim(x, d)
    return x


def _is_one(size) -> bool:
    return isinstance(size, int) and size == 1


def _ignoring_nan(pick):
    def decomposition(a, b):
        m = pick(a, b)
        if not (a.dtype.is_floating_point or b.dtype.is_floating_point):
            return m
        # the other operand where one is NaN (NaN only where both are)
        return A.where.self(A.isnan.default(b), a, A.where.self(A.isnan.default(a), b, m))
    return decomposition


def _hypot(a, b):
    """hypot without overflow: big * sqrt(1 + (small / big)^2); 0 where both are 0; +inf where
    either is infinite (even beside a NaN, as C's hypot)."""
    x, y = A.abs.default(a), A.abs.default(b)
    big, small = A.maximum.default(x, y), A.minimum.default(x, y)
    ratio = A.div.Tensor(small, big)
    h = A.mul.Tensor(big, A.sqrt.default(A.add.Scalar(A.mul.Tensor(ratio, ratio), 1)))
    h = A.where.self(A.eq.Scalar(big, 0), big, h)
    infinite = A.logical_or.default(A.isinf.default(x), A.isinf.default(y))
    return A.where.self(infinite, A.full_like.default(h, math.inf), h)


def _float_dtype(*values) -> torch.dtype:
    dtype = torch.result_type(*values)
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


def _signbit(x):
    """x < 0, or x == 0 with 1/x < 0 (negative zero). torchlib's `Less(x, [0])` missed -0.0 (a
    silent wrong answer, found with copysign) and made a 0-d input 1-d. The sign of a NaN has no
    ONNX reading: NaN from an input runs the call in PyTorch (every cluster checks its float
    inputs), so only a NaN made inside a cluster reads as positive."""
    if x.dtype is torch.bool:
        return A.full_like.default(x, False)
    negative = A.lt.Scalar(x, 0)
    if not x.dtype.is_floating_point:
        return negative
    negative_zero = A.logical_and.default(A.eq.Scalar(x, 0), A.lt.Scalar(A.reciprocal.default(x), 0))
    return A.logical_or.default(negative, negative_zero)


def _copysign_tensor(a, b):
    """|a| times 1 - 2·signbit(b): a product keeps the sign of a zero, where ONNX Runtime's
    Where returned +0.0 for a -0.0 it picked (measured: Where(True, -0.0, 0.0) = 0.0)."""
    dtype = _float_dtype(a, b)
    magnitude = A.abs.default(A._to_copy.default(a, dtype=dtype) if a.dtype != dtype else a)
    sign = A.add.Scalar(A.mul.Scalar(A._to_copy.default(_signbit(b), dtype=dtype), -2), 1)
    return A.mul.Tensor(magnitude, sign)


def _copysign_scalar(a, b):
    dtype = _float_dtype(a, b)
    magnitude = A.abs.default(A._to_copy.default(a, dtype=dtype) if a.dtype != dtype else a)
    return A.neg.default(magnitude) if math.copysign(1.0, float(b)) < 0 else magnitude


def _isin_tensor_tensor(elements, test_elements, *, assume_unique=False, invert=False):
    """Every element compared with every test element (torch's own choice for small test sets);
    NaN is in no set, as in eager."""
    found = A.any.dim(A.eq.Tensor(A.unsqueeze.default(elements, -1), A.reshape.default(test_elements, [-1])), -1)
    return A.logical_not.default(found) if invert else found


def _isin_tensor_scalar(elements, test_element, *, assume_unique=False, invert=False):
    found = A.eq.Scalar(elements, test_element)
    return A.logical_not.default(found) if invert else found


def _isin_scalar_tensor(element, test_elements, *, assume_unique=False, invert=False):
    value = A.full.default([], element, dtype=torch.result_type(element, test_elements))
    return _isin_tensor_tensor(value, test_elements, invert=invert)


def _sort(x, dim=-1, descending=False):
    """A stable sort from ONNX's TopK, which breaks ties by the lower index (stable) but does not
    order NaN as eager does (measured: NaN made inside a cluster came back between 3 and inf).
    Floats take two stable passes: by value with NaN as +inf, then by "is NaN" — NaN after +inf
    ascending, before it descending, in index order, as eager sorts."""
    if x.dim() == 0:
        return A.clone.default(x), A.full.default([], 0, dtype=torch.int64)
    dim = dim % x.dim()
    n = x.shape[dim]
    if not x.dtype.is_floating_point:
        return A.topk.default(x, n, dim, descending, True)
    nan = A.isnan.default(x)
    _, first = A.topk.default(A.where.self(nan, A.full_like.default(x, math.inf), x), n, dim, descending, True)
    flags = A.gather.default(A._to_copy.default(nan, dtype=torch.float32), dim, first)
    _, second = A.topk.default(flags, n, dim, descending, True)
    order = A.gather.default(first, dim, second)
    return A.gather.default(x, dim, order), order


def _sort_stable(x, *, stable=None, dim=-1, descending=False):
    return _sort(x, dim, descending)


def _searchsorted(sorted_sequence, values, *, out_int32=False, right=False, side=None, sorter=None):
    """The insertion point counted: how many sequence elements are < value (<= for the right
    side), which is what a binary search finds in a sorted sequence. A NaN value goes to the
    end, as in eager. (A NaN inside the sequence breaks its order: eager's answer then depends on
    its binary search's path — [-1, 0, 2, nan, nan] puts 3 at 5 — and is not reproduced; a NaN
    input runs the call in PyTorch anyway.)"""
    right = right or side == "right"
    seq = A.gather.default(sorted_sequence, -1, sorter) if sorter is not None else sorted_sequence
    s = A.unsqueeze.default(seq, -2) if seq.dim() > 1 else seq
    v = A.unsqueeze.default(values, -1)
    count = A.sum.dim_IntList(A.le.Tensor(s, v) if right else A.lt.Tensor(s, v), [-1])
    if values.dtype.is_floating_point:
        count = A.where.self(A.isnan.default(values), A.full_like.default(count, seq.shape[-1]), count)
    return A._to_copy.default(count, dtype=torch.int32) if out_int32 else count


def _searchsorted_scalar(sorted_sequence, value, *, out_int32=False, right=False, side=None, sorter=None):
    values = A.full.default([], value, dtype=torch.result_type(sorted_sequence, value))
    return _searchsorted(sorted_sequence, values, out_int32=out_int32, right=right, side=side, sorter=sorter)


def _bucketize(x, boundaries, *, out_int32=False, right=False):
    return _searchsorted(boundaries, x, out_int32=out_int32, right=right)


def _bucketize_scalar(x, boundaries, *, out_int32=False, right=False):
    return _searchsorted_scalar(boundaries, x, out_int32=out_int32, right=right)


def _repeat_interleave(x, repeats, dim=None, *, output_size=None):
    """repeat_interleave with tensor repeats and a known output size (a data-dependent size stays
    in PyTorch before this is reached): the source index of each output position is where it
    falls among the cumulative repeats. torch's own decomposition passed `output_size` on to
    `repeat_interleave.Tensor`, whose torchlib translation does not take it (TypeError)."""
    if dim is None:
        x, dim = A.reshape.default(x, [-1]), 0
    if output_size is None:
        return A.index_select.default(x, dim, A.repeat_interleave.Tensor(repeats))
    dim = dim % x.dim()
    if repeats.dim() == 0 or repeats.shape[0] == 1:   # one count for every element
        repeats = A.expand.default(A.reshape.default(repeats, [1]), [x.shape[dim]])
    ends = A.cumsum.default(repeats, 0)
    positions = A.arange.start_step(0, output_size, 1, dtype=torch.int64)
    return A.index_select.default(x, dim, _searchsorted(ends, positions, right=True))


_PADS = {("reflect", 1): A.reflection_pad1d, ("reflect", 2): A.reflection_pad2d, ("reflect", 3): A.reflection_pad3d,
         ("replicate", 1): A.replication_pad1d, ("replicate", 2): A.replication_pad2d,
         ("replicate", 3): A.replication_pad3d}


def _pad(x, pad, mode="constant", value=None):
    """pad by mode, as aten.pad dispatches, with `circular` as torch's slices-and-copies
    (`_pad_circular`): torchlib translates it to Pad(mode="wrap"), which ONNX Runtime 1.31's CPU
    kernel rejects at run time ("Unexpected mode of 3")."""
    if mode == "circular":
        return A._pad_circular.default(x, pad)
    if mode == "constant":
        return A.constant_pad_nd.default(x, pad, 0 if value is None else value)
    return _PADS[(mode, len(pad) // 2)].default(x, pad)


DECOMPOSITIONS = {
    A.squeeze.dims: _squeeze_dims,
    A.fmax.default: _ignoring_nan(A.maximum.default),
    A.fmin.default: _ignoring_nan(A.minimum.default),
    A.hypot.default: _hypot,
    A.signbit.default: _signbit,
    A.copysign.Tensor: _copysign_tensor,
    A.copysign.Scalar: _copysign_scalar,
    A.isin.Tensor_Tensor: _isin_tensor_tensor,
    A.isin.Tensor_Scalar: _isin_tensor_scalar,
    A.isin.Scalar_Tensor: _isin_scalar_tensor,
    A.sort.default: _sort,
    A.sort.stable: _sort_stable,
    A.searchsorted.Tensor: _searchsorted,
    A.searchsorted.Scalar: _searchsorted_scalar,
    A.bucketize.Tensor: _bucketize,
    A.bucketize.Scalar: _bucketize_scalar,
    A.repeat_interleave.self_Tensor: _repeat_interleave,
    A.pad.default: _pad,
}
