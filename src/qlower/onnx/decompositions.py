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

Some entries apply to some calls of an op only (`only_when`): the others keep the op as
torchlib translates it, without the exporter's re-trace. Where ONNX Runtime's Where would pick
a -0.0 from its first branch (it returns +0.0 then, measured), the value goes in the second.
"""
from __future__ import annotations

import math

import torch

from . import antialiased_resize, data_dependent_sizes, grid_sampling, segments
from .conditional import applies_to, only_when, static as _static

A = torch.ops.aten
# Quadratic decompositions (cumulative max/min/product compare every pair along the dim) stop here:
# 1024² float32 is 4 MiB per row of the other dims; longer dims stay in PyTorch, with their reason.
MAX_PAIRWISE = 1024


def decomposes(node, *, undecided: bool = True) -> bool:
    """Whether a conditional decomposition takes this FX node's call (read from its meta values);
    `undecided` where its predicate cannot tell (a symbolic size): the exporter's re-trace decides."""
    applies = applies_to(DECOMPOSITIONS.get(node.target))
    if applies is None:
        return False
    value = lambda n: n.meta.get("val")
    args = torch.fx.node.map_arg(node.args, value)
    kwargs = torch.fx.node.map_arg(node.kwargs, value)
    try:
        return bool(applies(*args, **kwargs))
    except Exception:
        return undecided


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
    if mode == "replicate" and any(p < 0 for p in pad):
        return _replicate_pad_by_gather(x, pad)
    return _PADS[(mode, len(pad) // 2)].default(x, pad)



def _replicate_pad_by_gather(x, pad):
    """Replicate padding as eager computes it, output position i reading input clamp(i - left,
    0, n - 1) per dim — also for negative pads, which crop first: ONNX Runtime's Pad(edge) fails
    at run time where the crop leaves nothing to replicate ("zero effective input extent")."""
    for i in range(len(pad) // 2):
        dim, left, right = x.dim() - 1 - i, pad[2 * i], pad[2 * i + 1]
        n = x.shape[dim]
        source = A.clamp.default(A.arange.start_step(-left, n + right, 1, dtype=torch.int64), 0, n - 1)
        x = A.index_select.default(x, dim, source)
    return x


def _is_scalar_topk(x, k, dim=-1, largest=True, sorted=True):
    return x.dim() == 0 and k == 1


@only_when(_is_scalar_topk)
def _topk_of_a_scalar(x, k, dim=-1, largest=True, sorted=True):
    """The value itself at index 0: ONNX Runtime's TopK rejects a 0-d input ("Invalid value for
    attribute axis")."""
    return A.clone.default(x), A.full.default([], 0, dtype=torch.int64)


_SCATTER_REDUCE = {"add": "sum", "multiply": "prod"}


def _scatter_reduce(x, dim, index, src, *, reduce):
    """scatter with reduce= (accumulating into self) is scatter_reduce with include_self, which
    torchlib translates (ScatterElements with a reduction)."""
    return A.scatter_reduce.two(x, dim, index, src, _SCATTER_REDUCE[reduce], include_self=True)


def _scatter_value_reduce(x, dim, index, value, *, reduce):
    src = A.full.default(list(index.shape), value, dtype=x.dtype)
    return _scatter_reduce(x, dim, index, src, reduce=reduce)


@only_when(lambda x, dim, index, src: x.dim() == 0)
def _scatter_add_of_a_scalar(x, dim, index, src):
    """On (1,)-shaped views: ONNX Runtime's ScatterElements fails on 0-d tensors at run time."""
    one = lambda t: A.reshape.default(t, [1])
    return A.reshape.default(A.scatter_add.default(one(x), 0, one(index), one(src)), [])


def _from_the_end(index, x):
    """Flat indices into x with negative ones counted from the end (take, put)."""
    return A.where.self(A.lt.Scalar(index, 0), A.add.Scalar(index, x.numel()), index)


def _take(x, index):
    """take: a gather from the flattened input, negative indices counted from the end. torch's
    own decomposition guards on the index values (data-dependent: it failed to compile)."""
    picked = A.index_select.default(A.reshape.default(x, [-1]), 0, _from_the_end(A.reshape.default(index, [-1]), x))
    return A.reshape.default(picked, list(index.shape))


def _diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    """src written onto a diagonal by ScatterElements on the (rows x cols)-flattened matrices.
    torch's own decomposition writes through a view (prims.copy_to), which the exporter's
    functional re-trace rejects."""
    n = x.dim()
    dim1, dim2 = dim1 % n, dim2 % n
    order = [d for d in range(n) if d not in (dim1, dim2)] + [dim1, dim2]
    moved = A.permute.default(x, order)
    batch, rows, cols = list(moved.shape[:-2]), moved.shape[-2], moved.shape[-1]
    start = offset if offset >= 0 else -offset * cols
    positions = A.add.Scalar(A.mul.Scalar(A.arange.default(src.shape[-1], dtype=torch.int64), cols + 1), start)
    index = A.expand.default(positions, batch + [src.shape[-1]])
    flat = A.scatter.src(A.reshape.default(moved, batch + [rows * cols]), -1, index, src)
    back = [order.index(d) for d in range(n)]
    return A.permute.default(A.reshape.default(flat, batch + [rows, cols]), back)


def _contiguous_static(x, src, size, stride, storage_offset=None) -> bool:
    sizes = [*x.shape, *src.shape, *size, *stride]
    return _static(*sizes) and x.is_contiguous() and list(src.shape) == list(size)


@only_when(_contiguous_static)
def _as_strided_scatter(x, src, size, stride, storage_offset=None):
    """src written at the storage positions of x.as_strided(size, stride, offset): offset +
    sum over dims of index * stride, from aranges broadcast against each other, then ScatterElements
    on the flattened (contiguous) x. torch's own decomposition ends in
    prims.as_strided_scatter, which torchlib does not translate."""
    position = A.full.default([1] * len(size), storage_offset or 0, dtype=torch.int64)
    for d, (extent, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = extent
        steps = A.mul.Scalar(A.arange.default(extent, dtype=torch.int64), step)
        position = A.add.Tensor(position, A.reshape.default(steps, shape))
    flat = A.reshape.default(x, [-1])
    index = A.reshape.default(A.expand.default(position, list(size)), [-1])
    written = A.scatter.src(flat, 0, index, A.reshape.default(src, [-1]))
    return A.reshape.default(written, list(x.shape))


def _same_count(x, size, memory_format=None) -> bool:
    return (_static(*x.shape, *size) and x.is_contiguous() and x.numel() == math.prod(size)
            and memory_format in (None, torch.contiguous_format))


@only_when(_same_count)
def _resize_keeping_the_count(x, size, memory_format=None):
    """resize to as many elements as there are, of a contiguous tensor: its elements in order,
    in the new shape (what resize_ leaves in the storage). Growing would expose uninitialized
    memory and stays in PyTorch. (The caller's tensor keeps its shape, as in torch.export's own
    program, which drops the metadata mutation of an input.)"""
    return A.clone.default(A.reshape.default(x, list(size)))


def _pairwise_dim(x, dim, *args, **kwargs) -> bool:
    """The dim is short enough to compare every pair of its positions (MAX_PAIRWISE)."""
    return x.dim() == 0 or (_static(x.shape[dim % x.dim()]) and x.shape[dim % x.dim()] <= MAX_PAIRWISE)


def _prefix_rows(x, dim):
    """x with `dim` moved last, as (..., n, n) rows: [..., i, j] = x[..., j]; and the mask j <= i."""
    moved = A.transpose.int(x, dim, -1)
    n = moved.shape[-1]
    rows = A.expand.default(A.unsqueeze.default(moved, -2), list(moved.shape[:-1]) + [n, n])
    ones = A.full.default([n, n], True, dtype=torch.bool)
    return moved, rows, A.tril.default(ones)


@only_when(_pairwise_dim)
def _cumprod(x, dim, *, dtype=None):
    """Prefix products as the product of each prefix (a masked ReduceProd per position): torch's
    own decomposition reaches prims.prod, which torchlib does not translate. The mask puts the
    1s in Where's first branch: ONNX Runtime's Where returns +0.0 for a -0.0 it picks from its
    first branch (measured), and a product must keep the sign of a zero."""
    if dtype is None and not (x.dtype.is_floating_point or x.dtype.is_complex):
        dtype = torch.int64   # as eager: integer prefix products are int64
    if dtype is not None and dtype != x.dtype:
        x = A._to_copy.default(x, dtype=dtype)
    if x.dim() == 0:
        return A.clone.default(x)
    dim = dim % x.dim()
    _, rows, lower = _prefix_rows(x, dim)
    masked = A.where.self(A.logical_not.default(lower), A.full.default([], 1, dtype=x.dtype), rows)
    return A.transpose.int(A.prod.dim_int(masked, -1), dim, -1)


def _cumulative_extreme(largest: bool):
    def decomposition(x, dim):
        """cummax / cummin: the index first — the last position j <= i holding the prefix's extreme
        (ties go to the later position, as eager's `>=`), or its last NaN once one was seen — and
        the value read there, so a signed zero comes back as eager's."""
        if x.dim() == 0:
            return A.clone.default(x), A.full.default([], 0, dtype=torch.int64)
        dim = dim % x.dim()
        moved, rows, lower = _prefix_rows(x, dim)
        n = moved.shape[-1]
        if x.dtype.is_floating_point:
            fill = -math.inf if largest else math.inf
        else:
            info = torch.iinfo(x.dtype) if x.dtype is not torch.bool else None
            fill = (info.min if largest else info.max) if info else (not largest)
        masked = A.where.self(A.logical_not.default(lower), A.full.default([], fill, dtype=x.dtype), rows)
        extreme = A.unsqueeze.default((A.amax if largest else A.amin).default(masked, [-1]), -1)
        hit = A.logical_and.default(lower, A.eq.Tensor(rows, extreme))
        position = A.arange.default(n, dtype=torch.int64)
        none = A.full.default([], -1, dtype=torch.int64)
        index = A.amax.default(A.where.self(hit, position, none), [-1])
        if x.dtype.is_floating_point:
            nan = A.logical_and.default(lower, A.isnan.default(rows))
            last_nan = A.amax.default(A.where.self(nan, position, none), [-1])
            index = A.where.self(A.ge.Scalar(last_nan, 0), last_nan, index)
        back = lambda t: A.transpose.int(t, dim, -1)
        return back(A.gather.default(moved, -1, index)), back(index)
    return only_when(_pairwise_dim)(decomposition)


def _per_dim(value, nd: int) -> list:
    value = [value] if isinstance(value, int) else list(value)
    return value * nd if len(value) == 1 else value


def _avg_pool_with_divisor(nd: int):
    def applies(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None) -> bool:
        return divisor_override is not None and _static(*x.shape[-nd - 1:])

    @only_when(applies)
    def decomposition(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                      divisor_override=None):
        """avg_pool with divisor_override: the window sum (a depthwise convolution with a kernel
        of ones over the zero-padded input, padded further on the right where ceil_mode lets the
        last window overhang) divided by the divisor. torchlib's translation drops
        divisor_override (measured: the plain mean, off by 0.9 on randn input)."""
        k = _per_dim(kernel_size, nd)
        s = _per_dim(stride, nd) if len(stride) else k
        p = _per_dim(padding, nd)
        unbatched = x.dim() == nd + 1
        if unbatched:
            x = A.unsqueeze.default(x, 0)
        pads = []
        for i in reversed(range(nd)):   # constant_pad_nd: last dim first
            size = x.shape[2 + i]
            out = (size + 2 * p[i] - k[i] + ((s[i] - 1) if ceil_mode else 0)) // s[i] + 1
            if ceil_mode and (out - 1) * s[i] >= size + p[i]:
                out -= 1   # the last window must start inside the input or its left padding
            pads += [p[i], p[i] + max(0, (out - 1) * s[i] + k[i] - (size + 2 * p[i]))]
        channels = x.shape[1]
        ones = A.full.default([channels, 1] + k, 1.0, dtype=x.dtype)
        total = A.convolution.default(A.constant_pad_nd.default(x, pads, 0.0), ones, None, s, [0] * nd,
                                      [1] * nd, False, [0] * nd, channels)
        out = A.div.Scalar(total, divisor_override)
        return A.squeeze.dim(out, 0) if unbatched else out
    return decomposition


def _einsum_terms(equation: str, operands) -> tuple[list[str], str] | None:
    """The equation with every '...' spelled out as letters (right-aligned, as broadcasting
    aligns them) and the output made explicit, or None where an operand repeats a letter."""
    equation = equation.replace(" ", "")
    lhs, rhs = equation.split("->") if "->" in equation else (equation, None)
    terms = lhs.split(",")
    ranks = [t.dim() - len(term.replace("...", "")) for t, term in zip(operands, terms)]
    spelled = [chr(0x3b1 + i) for i in range(max([r for r in ranks] + [0]))]   # α, β, ...
    terms = [term.replace("...", "".join(spelled[len(spelled) - r:])) for term, r in zip(terms, ranks)]
    if any(len(set(term)) != len(term) for term in terms):
        return None
    if rhs is None:
        letters = "".join(terms)
        rhs = "".join(spelled) + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in spelled))
    else:
        rhs = rhs.replace("...", "".join(spelled))
    return terms, rhs


def _broadcast_ellipsis(equation, operands, path=None) -> bool:
    """'...' stands for different shapes in different operands (ONNX Runtime's Einsum rejects
    that: "Ellipsis represents incompatible dimensions")."""
    if "..." not in equation or len(operands) < 2:
        return False
    terms = equation.replace(" ", "").split("->")[0].split(",")
    covered = [tuple(t.shape[:t.dim() - len(term.replace("...", ""))]) if term.startswith("...")
               else tuple(t.shape[term.index("..."):term.index("...") + t.dim() - len(term.replace("...", ""))])
               for t, term in zip(operands, terms) if "..." in term]
    return len(set(covered)) > 1 and _einsum_terms(equation, operands) is not None


@only_when(_broadcast_ellipsis)
def _einsum_by_broadcasting(equation, operands, path=None):
    """Each operand's dims put in one order (output letters first), missing ones as size 1,
    multiplied with broadcasting, summed over the contracted letters."""
    terms, rhs = _einsum_terms(equation, operands)
    letters = list(rhs) + sorted({c for term in terms for c in term} - set(rhs))
    product = None
    for t, term in zip(operands, terms):
        present = [c for c in letters if c in term]
        aligned = A.permute.default(t, [term.index(c) for c in present])
        shape = [aligned.shape[present.index(c)] if c in term else 1 for c in letters]
        aligned = A.reshape.default(aligned, shape)
        product = aligned if product is None else A.mul.Tensor(product, aligned)
    contracted = list(range(len(rhs), len(letters)))
    return A.sum.dim_IntList(product, contracted) if contracted else product


def _cross_entropy_with_probabilities(x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    """Class probabilities as the target: -sum(target * log_softmax(x)) over the class dim,
    with eager's label smoothing, class weights and 'mean' over the non-class elements.
    torchlib's SoftmaxCrossEntropyLoss takes class indices only (rejected by ONNX Runtime)."""
    class_dim = 1 if x.dim() > 1 else 0
    classes = x.shape[class_dim]
    if label_smoothing > 0:
        target = A.add.Scalar(A.mul.Scalar(target, 1 - label_smoothing), label_smoothing / classes)
    terms = A.mul.Tensor(A._log_softmax.default(x, class_dim, False), target)
    if weight is not None:
        terms = A.mul.Tensor(terms, A.reshape.default(weight, [classes] + [1] * (x.dim() - class_dim - 1)))
    loss = A.neg.default(A.sum.dim_IntList(terms, [class_dim]))
    if reduction == 0:
        return loss
    total = A.sum.default(loss)
    return total if reduction == 2 else A.div.Scalar(total, x.numel() // classes)


def _contracts_nothing(c, m1, m2, *, beta=1, alpha=1) -> bool:
    return _static(m1.shape[-1]) and m1.shape[-1] == 0


@only_when(_contracts_nothing)
def _addmm_over_nothing(c, m1, m2, *, beta=1, alpha=1):
    """K = 0: beta * c (zeros where beta is 0, as BLAS, which never reads c then). ONNX Runtime's
    Gemm returned c unscaled (measured: addmm(c, [5, 0], [0, 10], beta=0.2) == c)."""
    shape = [m1.shape[0], m2.shape[1]]
    if beta == 0:
        return A.full.default(shape, 0, dtype=c.dtype)
    out = A.expand.default(c, shape)
    return A.clone.default(out) if beta == 1 else A.mul.Scalar(out, beta)


MAX_ADAPTIVE_WINDOWS = 64   # per dim: each window is a slice and a reduction in the graph


def _windows(size: int, out: int) -> list[tuple[int, int]]:
    """Adaptive pooling's windows along one dim: [floor(i·size/out), ceil((i+1)·size/out))."""
    return [((i * size) // out, -(-((i + 1) * size) // out)) for i in range(out)]


def _adaptive(nd: int):
    def applies(x, output_size) -> bool:
        sizes = list(x.shape[-nd:]) + list(output_size)
        return _static(*sizes) and all(0 < o <= MAX_ADAPTIVE_WINDOWS for o in output_size) \
            and all(s > 0 for s in x.shape[-nd:])
    return applies


def _adaptive_avg_pool(nd: int):
    @only_when(_adaptive(nd))
    def decomposition(x, output_size):
        """The mean of each window, one spatial dim at a time (the mean over a box is the mean of
        its rows' means: every row of a window has the same length). torch's decomposition of
        adaptive_avg_pool3d ends in _adaptive_avg_pool3d, which torchlib does not translate."""
        for i, out in enumerate(output_size):
            dim = x.dim() - nd + i
            windows = _windows(x.shape[dim], out)
            if all(e - s == 1 for s, e in windows):
                continue
            x = A.cat.default([A.mean.dim(A.slice.Tensor(x, dim, s, e), [dim], True) for s, e in windows], dim)
        return x
    return decomposition


def _first_max_or_last_nan(v, dim: int):
    """Per window along `dim` (kept, size 1): the position eager's max pooling keeps — the first
    maximum (it replaces only on `>`), or the last NaN (it replaces on every NaN)."""
    n = v.shape[dim]
    pos = A.reshape.default(A.arange.default(n, dtype=torch.int64), [n if d == dim else 1 for d in range(v.dim())])
    if v.dtype.is_floating_point:
        nan = A.isnan.default(v)
        v = A.where.self(nan, A.full.default([], -math.inf, dtype=v.dtype), v)
    best = A.amax.default(v, [dim], True)
    past_the_end = A.full.default([], n, dtype=torch.int64)
    first = A.amin.default(A.where.self(A.eq.Tensor(v, best), pos, past_the_end), [dim], True)
    if not v.dtype.is_floating_point:
        return first
    last_nan = A.amax.default(A.where.self(nan, pos, A.full.default([], -1, dtype=torch.int64)), [dim], True)
    return A.where.self(A.ge.Scalar(last_nan, 0), last_nan, first)


def _adaptive_max_pool(nd: int):
    @only_when(_adaptive(nd))
    def decomposition(x, output_size):
        """Values and flat spatial indices, one spatial dim at a time: per window the first
        maximum or the last NaN along that dim, carrying the index of where each value came
        from. Done row after row that is eager's row-major scan (ties to the earlier position,
        NaN to the later one); the value is read at the index, so -0.0 and 0.0 come back as
        eager picks them. torchlib has no translation for adaptive_max_pool2d/3d."""
        spatial = list(x.shape[-nd:])
        index = A.expand.default(A.reshape.default(A.arange.default(math.prod(spatial), dtype=torch.int64), spatial),
                                 list(x.shape))
        for i, out in enumerate(output_size):
            dim = x.dim() - nd + i
            values, indices = [], []
            for s, e in _windows(x.shape[dim], out):
                v, idx = A.slice.Tensor(x, dim, s, e), A.slice.Tensor(index, dim, s, e)
                k = _first_max_or_last_nan(v, dim)
                values.append(A.gather.default(v, dim, k))
                indices.append(A.gather.default(idx, dim, k))
            x, index = A.cat.default(values, dim), A.cat.default(indices, dim)
        return x, index
    return decomposition


@only_when(lambda x, dim, index, source, reduce, *, include_self=True:
           reduce in ("prod", "amax", "amin") or (reduce == "mean" and x.dtype.is_floating_point))
def _index_reduce(x, dim, index, source, reduce, *, include_self=True):
    """index_reduce is scatter_reduce with the index spread along `dim` over the source's other
    dims; "mean" is index_add's sum over index_add's count (plus the element itself where
    include_self; the element unchanged where nothing lands), not scatter_reduce's mean, which
    reached ONNX Runtime as its own (wrong) one. Integer means (eager floor-divides) stay in PyTorch."""
    if reduce == "mean":
        return _index_mean(x, dim, index, source, include_self)
    dim = dim % max(source.dim(), 1)
    shape = [index.shape[0] if d == dim else 1 for d in range(source.dim())]
    spread = A.expand.default(A.reshape.default(index, shape), list(source.shape))
    return A.scatter_reduce.two(x, dim, spread, source, reduce, include_self=include_self)


def _index_mean(x, dim, index, source, include_self: bool):
    count = A.index_add.default(A.zeros_like.default(x), dim, index, A.ones_like.default(source))
    total = A.index_add.default(x if include_self else A.zeros_like.default(x), dim, index, source)
    if include_self:
        return A.div.Tensor(total, A.add.Scalar(count, 1))
    landed = A.gt.Scalar(count, 0)
    return A.where.self(landed, A.div.Tensor(total, A.where.self(landed, count, A.ones_like.default(count))), x)


_FLOAT_FORMATS = {torch.float32: (23, -126), torch.float64: (52, -1022)}   # mantissa bits, least normal exponent


@only_when(lambda x, y: x.dtype in _FLOAT_FORMATS and y.dtype == x.dtype)
def _nextafter(x, y):
    """The next representable value after x toward y, from x's exponent (no bit casts in ONNX):
    the spacing at |x| in [2^e, 2^(e+1)) is 2^(e - p) (p mantissa bits; the subnormal spacing
    below the least normal exponent), half that just below a power of two; y where x == y, the
    least subnormal toward y from ±0, the largest finite value from ±inf, NaN from a NaN.
    Computed in float64 (float32's steps are exact there); torch's own decomposition reaches
    prims.nextafter, which torchlib does not translate."""
    mantissa, least = _FLOAT_FORMATS[x.dtype]
    wide, toward = A._to_copy.default(x, dtype=torch.float64), A._to_copy.default(y, dtype=torch.float64)
    magnitude = A.abs.default(wide)
    finite = A.where.self(A.logical_and.default(A.isfinite.default(magnitude), A.gt.Scalar(magnitude, 0)),
                          magnitude, A.ones_like.default(magnitude))
    e = A.floor.default(A.log2.default(finite))   # then corrected by one where log2 rounded across
    e = A.where.self(A.gt.Tensor(A.pow.Scalar(2.0, e), finite), A.sub.Scalar(e, 1), e)
    e = A.where.self(A.le.Tensor(A.pow.Scalar(2.0, A.add.Scalar(e, 1)), finite), A.add.Scalar(e, 1), e)
    spacing = A.pow.Scalar(2.0, A.sub.Scalar(A.clamp_min.default(e, least), mantissa))
    up = A.eq.Tensor(A.gt.Tensor(toward, wide), A.ge.Scalar(wide, 0))   # away from zero
    at_power = A.logical_and.default(A.eq.Tensor(finite, A.pow.Scalar(2.0, e)), A.gt.Scalar(e, least))
    step = A.where.self(A.logical_and.default(A.logical_not.default(up), at_power), A.mul.Scalar(spacing, 0.5), spacing)
    direction = A.where.self(A.gt.Tensor(toward, wide), A.ones_like.default(wide), A.full_like.default(wide, -1.0))
    result = A.add.Tensor(wide, A.mul.Tensor(direction, step))
    tiny = A.mul.Tensor(direction, A.full_like.default(wide, 2.0 ** (least - mantissa)))
    result = A.where.self(A.eq.Scalar(wide, 0), tiny, result)
    largest = A.mul.Tensor(A.sign.default(wide), A.full_like.default(wide, float(torch.finfo(x.dtype).max)))
    result = A.where.self(A.isinf.default(wide), largest, result)
    result = A.where.self(A.eq.Tensor(wide, toward), toward, result)
    result = A.where.self(A.logical_or.default(A.isnan.default(wide), A.isnan.default(toward)),
                          A.add.Tensor(wide, toward), result)
    # A zero's sign is set by multiplying (ONNX Runtime's Where returns +0.0 for a -0.0): y's
    # where x == y, else x's (-least subnormal toward 0 gives -0.0).
    negative = lambda t: A.logical_or.default(A.lt.Scalar(t, 0), A.lt.Scalar(A.reciprocal.default(t), 0))
    unit = lambda t: A.where.self(negative(t), A.full_like.default(t, -1.0), A.ones_like.default(t))
    zero_sign = A.where.self(A.eq.Tensor(wide, toward), unit(toward), unit(wide))
    sign = A.where.self(A.gt.Scalar(A.abs.default(result), 0), A.sign.default(result), zero_sign)
    return A._to_copy.default(A.mul.Tensor(A.abs.default(result), sign), dtype=x.dtype)


def _empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    """Uninitialized memory of that size: zeros are one such value (the layout is a stride
    order, which an ONNX tensor does not have)."""
    return A.full.default(list(size), 0, dtype=dtype or torch.get_default_dtype())


def _put(x, index, source, accumulate=False):
    """put: index_put on the flattened input, negative indices counted from the end."""
    wrapped = _from_the_end(A.reshape.default(index, [-1]), x)
    out = A.index_put.default(A.reshape.default(x, [-1]), [wrapped], A.reshape.default(source, [-1]), accumulate)
    return A.reshape.default(out, list(x.shape))


@only_when(lambda x, size, fill_value=-1: _static(*x.shape) and x.dim() > 0 and x.numel() > 0)
def _nonzero_static(x, *, size, fill_value=-1):
    """The coordinates of the first `size` nonzero elements in row-major order, fill_value past
    the last: slot s holds the element whose running count of nonzeros is s + 1."""
    n = x.numel()
    mask = A.ne.Scalar(A.reshape.default(x, [-1]), 0)
    rank = A.sub.Scalar(A.cumsum.default(A._to_copy.default(mask, dtype=torch.int64), 0), 1)
    slots = A.reshape.default(A.arange.default(size, dtype=torch.int64), [size, 1])
    hit = A.logical_and.default(A.unsqueeze.default(mask, 0), A.eq.Tensor(A.unsqueeze.default(rank, 0), slots))
    position = A.arange.default(n, dtype=torch.int64)
    flat = A.amax.default(A.where.self(hit, position, A.full.default([], -1, dtype=torch.int64)), [1])
    coordinates, stride = [], n
    for extent in x.shape:
        stride //= extent
        coordinates.append(A.remainder.Scalar(A.div.Tensor_mode(flat, stride, rounding_mode="floor"), extent))
    found = A.unsqueeze.default(A.ge.Scalar(flat, 0), 1)
    return A.where.self(found, A.stack.default(coordinates, 1), A.full.default([], fill_value, dtype=torch.int64))


def _one_sample_class_target(x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0) -> bool:
    return x.dim() == 1 and not target.dtype.is_floating_point and label_smoothing == 0.0


def _cross_entropy_of_one_sample(x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    """One unbatched sample with a class index: -w[t]·log_softmax(x)[t], 0 where t is ignored;
    'mean' divides by w[t] (0/0 = NaN for an ignored target, as eager). torchlib's
    SoftmaxCrossEntropyLoss translation of a 1-D input was rejected by ONNX Runtime."""
    kept = A.ne.Scalar(target, ignore_index)
    t = A.reshape.default(A.where.self(kept, target, A.zeros_like.default(target)), [1])
    logp = A.reshape.default(A.index_select.default(A._log_softmax.default(x, 0, False), 0, t), [])
    w = A.full.default([], 1.0, dtype=x.dtype) if weight is None \
        else A.reshape.default(A.index_select.default(weight, 0, t), [])
    w = A.where.self(kept, w, A.zeros_like.default(w))
    loss = A.neg.default(A.mul.Tensor(logp, w))
    return A.div.Tensor(loss, w) if reduction == 1 else loss


def _cross_entropy_smoothed(x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    """Class indices with label smoothing, eager's formula: (1 - e) * nll + e / C * the sum of
    -w_c * log p_c over classes, an ignored target contributing 0, 'mean' dividing both by the
    sum of w[t] over kept targets (their count without weights). torchlib 0.7.2 drops
    label_smoothing here (measured: the same loss for e = 0.1 and 0.9, 1.2% off at 0.9)."""
    class_dim = 1 if x.dim() > 1 else 0
    classes = x.shape[class_dim]
    logp = A._log_softmax.default(x, class_dim, False)
    kept = A.ne.Scalar(target, ignore_index)
    safe = A.where.self(kept, target, A.zeros_like.default(target))
    picked = A.squeeze.dim(A.gather.default(logp, class_dim, A.unsqueeze.default(safe, class_dim)), class_dim)
    per_class = [1] * x.dim()
    per_class[class_dim] = classes
    if weight is None:
        w_t = A._to_copy.default(kept, dtype=x.dtype)
        smooth = A.neg.default(A.sum.dim_IntList(logp, [class_dim]))
    else:
        w_t = A.where.self(kept, A.index.Tensor(weight, [safe]), A.zeros_like.default(picked))
        smooth = A.neg.default(A.sum.dim_IntList(A.mul.Tensor(logp, A.reshape.default(weight, per_class)), [class_dim]))
    nll = A.neg.default(A.mul.Tensor(picked, w_t))
    smooth = A.where.self(kept, smooth, A.zeros_like.default(smooth))
    if reduction == 0:
        return A.add.Tensor(A.mul.Scalar(nll, 1 - label_smoothing), A.mul.Scalar(smooth, label_smoothing / classes))
    nll, smooth = A.sum.default(nll), A.sum.default(smooth)
    if reduction == 1:
        total = A.sum.default(w_t)
        nll, smooth = A.div.Tensor(nll, total), A.div.Tensor(smooth, total)
    return A.add.Tensor(A.mul.Scalar(nll, 1 - label_smoothing), A.mul.Scalar(smooth, label_smoothing / classes))


def _smoothed_class_target(x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0) -> bool:
    return not target.dtype.is_floating_point and label_smoothing > 0


def _written_cross_entropy(x, target, *args, **kwargs) -> bool:
    return target.dtype.is_floating_point or _one_sample_class_target(x, target, *args, **kwargs) \
        or _smoothed_class_target(x, target, *args, **kwargs)


@only_when(_written_cross_entropy)
def _cross_entropy(x, target, *args, **kwargs):
    """Class probabilities, one unbatched sample's class index, or class indices with label
    smoothing; batched class indices without smoothing keep torchlib's translation."""
    if target.dtype.is_floating_point:
        return _cross_entropy_with_probabilities(x, target, *args, **kwargs)
    if _smoothed_class_target(x, target, *args, **kwargs):
        return _cross_entropy_smoothed(x, target, *args, **kwargs)
    return _cross_entropy_of_one_sample(x, target, *args, **kwargs)


_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _no_gradients(x, linear_weight, target, linear_bias, weight, reduction, ignore_index, label_smoothing,
                  batch_chunk_size, acc_policy, acc_dtype, allow_retain_graph, compute_input_grad,
                  compute_linear_weight_grad, compute_linear_bias_grad) -> bool:
    return not (compute_input_grad or compute_linear_weight_grad or compute_linear_bias_grad) \
        and reduction in ("mean", "sum") and acc_dtype == x.dtype


@only_when(_no_gradients)
def _linear_cross_entropy_chunked(x, linear_weight, target, linear_bias, weight, reduction, ignore_index,
                                  label_smoothing, *options):
    """torch.nn's chunked linear + cross-entropy (a custom op torch.onnx cannot see into) as the
    unchunked linear and cross_entropy it computes in chunks of the batch; the gradients it
    returns are empty where none is asked for, as its own fake kernel says."""
    logits = A.linear.default(x, linear_weight, linear_bias)
    loss = A.cross_entropy_loss.default(logits, target, weight, _REDUCTIONS[reduction], ignore_index, label_smoothing)
    empty = lambda *shape: A.zeros.default(list(shape), dtype=x.dtype)
    return loss, empty(0, 0), empty(0, 0), empty(0)


@only_when(lambda x, linear_weight, target, linear_bias, weight, ignore_index, batch_chunk_size, acc_policy, acc_dtype:
           acc_dtype == x.dtype)
def _linear_cross_entropy_chunked_per_sample(x, linear_weight, target, linear_bias, weight, ignore_index, *options):
    logits = A.linear.default(x, linear_weight, linear_bias)
    return A.cross_entropy_loss.default(logits, target, weight, 0, ignore_index, 0.0)


def _torch_nn_ops() -> dict:
    """torch.nn's custom ops, registered when their module is imported (torch 2.13)."""
    try:
        import torch.nn.modules.linear_cross_entropy  # noqa: F401
        ops = torch.ops.torch_nn
        return {ops._linear_cross_entropy_batch_chunked.default: _linear_cross_entropy_chunked,
                ops._linear_cross_entropy_batch_chunked_no_reduction.default: _linear_cross_entropy_chunked_per_sample}
    except (ImportError, AttributeError):
        return {}


def _pairwise_distances(x1, x2, p):
    """||x1_i - x2_j||_p over the last dim, from the differences (eager's direct kernel)."""
    diff = A.sub.Tensor(A.unsqueeze.default(x1, -2), A.unsqueeze.default(x2, -3))
    size = A.abs.default(diff)
    if p == 0:
        return A.sum.dim_IntList(A._to_copy.default(A.ne.Scalar(diff, 0), dtype=x1.dtype), [-1])
    if p == math.inf:
        return A.amax.default(size, [-1])
    if p == 1:
        return A.sum.dim_IntList(size, [-1])
    if p == 2:
        return A.sqrt.default(A.sum.dim_IntList(A.mul.Tensor(diff, diff), [-1]))
    return A.pow.Tensor_Scalar(A.sum.dim_IntList(A.pow.Tensor_Scalar(size, p), [-1]), 1.0 / p)


def _euclidean_by_products(x1, x2):
    """Eager's matrix-product form of Euclidean distances (what it uses for p = 2 on more than
    25 rows, or when asked): sqrt(max(|a|² + |b|² - 2a·b, 1e-30)), built as eager builds it."""
    n1 = A.sum.dim_IntList(A.mul.Tensor(x1, x1), [-1], True)
    n2 = A.sum.dim_IntList(A.mul.Tensor(x2, x2), [-1], True)
    left = A.cat.default([A.mul.Scalar(x1, -2), n1, A.ones_like.default(n1)], -1)
    right = A.cat.default([x2, A.ones_like.default(n2), n2], -1)
    return A.sqrt.default(A.clamp_min.default(A.matmul.default(left, A.transpose.int(right, -1, -2)), 1e-30))


def _cdist_forward(x1, x2, p, compute_mode=None):
    """cdist in eager's two forms, chosen as eager chooses (compute_mode 1: products, 2: direct,
    None/0: products for p = 2 beyond 25 rows on either side). torch's table leaves
    _cdist_forward, which torchlib does not translate."""
    by_products = p == 2 and (compute_mode == 1 or (compute_mode in (None, 0)
                                                   and (x1.shape[-2] > 25 or x2.shape[-2] > 25)))
    return _euclidean_by_products(x1, x2) if by_products else _pairwise_distances(x1, x2, p)


MAX_PDIST_ROWS = 256   # one arange per row in the graph


@only_when(lambda x, p=2: _static(x.shape[0]) and x.shape[0] <= MAX_PDIST_ROWS)
def _pdist_forward(x, p=2):
    """The distances of rows i < j, in row-major order (eager's direct kernel): the flattened
    distance matrix read at i·n + j for j > i, one arange per row."""
    n = x.shape[0]
    picks = A.cat.default([A.arange.start_step(i * n + i + 1, (i + 1) * n, 1, dtype=torch.int64) for i in range(n - 1)]
                          or [A.full.default([0], 0, dtype=torch.int64)])
    return A.index_select.default(A.reshape.default(_pairwise_distances(x, x, p), [-1]), 0, picks)


def _frexp(x):
    """frexp: x = mantissa · 2^exponent with |mantissa| in [1/2, 1), from log2 in float64 and
    one correction step either way (log2 may round across a power of two); (x, 0) for ±0, ±inf
    and NaN, as eager. torch's own decomposition reaches prims.frexp."""
    wide = A._to_copy.default(x, dtype=torch.float64)
    magnitude = A.abs.default(wide)
    exponent = A.add.Scalar(A.floor.default(A.log2.default(magnitude)), 1)
    mantissa = A.div.Tensor(wide, A.pow.Scalar(2.0, exponent))
    high = A.ge.Scalar(A.abs.default(mantissa), 1.0)
    low = A.lt.Scalar(A.abs.default(mantissa), 0.5)
    mantissa = A.where.self(high, A.mul.Scalar(mantissa, 0.5), A.where.self(low, A.mul.Scalar(mantissa, 2.0), mantissa))
    exponent = A.add.Tensor(exponent, A.sub.Tensor(A._to_copy.default(high, dtype=torch.float64),
                                                   A._to_copy.default(low, dtype=torch.float64)))
    # x itself in Where's second branch: ONNX Runtime's Where loses a -0.0 picked from its first
    ordinary = A.logical_and.default(A.ne.Scalar(wide, 0), A.isfinite.default(wide))
    mantissa = A.where.self(ordinary, mantissa, wide)
    exponent = A.where.self(ordinary, exponent, A.zeros_like.default(exponent))
    return A._to_copy.default(mantissa, dtype=x.dtype), A._to_copy.default(exponent, dtype=torch.int32)


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
    A.topk.default: _topk_of_a_scalar,
    A.scatter.reduce: _scatter_reduce,
    A.scatter.value_reduce: _scatter_value_reduce,
    A.scatter_add.default: _scatter_add_of_a_scalar,
    A.take.default: _take,
    A.diagonal_scatter.default: _diagonal_scatter,
    A.as_strided_scatter.default: _as_strided_scatter,
    A.resize.default: _resize_keeping_the_count,
    A.cumprod.default: _cumprod,
    A.cummax.default: _cumulative_extreme(largest=True),
    A.cummin.default: _cumulative_extreme(largest=False),
    A.avg_pool2d.default: _avg_pool_with_divisor(2),
    A.avg_pool3d.default: _avg_pool_with_divisor(3),
    A.einsum.default: _einsum_by_broadcasting,
    A.addmm.default: _addmm_over_nothing,
    A.adaptive_avg_pool3d.default: _adaptive_avg_pool(3),
    A._adaptive_avg_pool3d.default: _adaptive_avg_pool(3),
    A.adaptive_max_pool2d.default: _adaptive_max_pool(2),
    A.adaptive_max_pool3d.default: _adaptive_max_pool(3),
    A.index_reduce.default: _index_reduce,
    A.empty_permuted.default: _empty_permuted,
    A.nextafter.default: _nextafter,
    A.put.default: _put,
    A.nonzero_static.default: _nonzero_static,
    A.cross_entropy_loss.default: _cross_entropy,
    A._cdist_forward.default: _cdist_forward,
    A._pdist_forward.default: _pdist_forward,
    A.frexp.Tensor: _frexp,
    **data_dependent_sizes.DECOMPOSITIONS,
    **segments.DECOMPOSITIONS,
    **antialiased_resize.DECOMPOSITIONS,
    **grid_sampling.DECOMPOSITIONS,
    **_torch_nn_ops(),
}
