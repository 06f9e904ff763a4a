"""The one place that answers: after a shape-only op, what are the QParams of the result?

Used by constant folding, Q/DQ propagation and the quantizer (to pick the weight axis that
lands on a consumer's output channel). `derive` returns the new QParams, or a `str` refusal.
Rules: permute -> axis' = perm.index(axis); transpose swaps; reshape/view/flatten only when the
channel dimension survives intact (not merged with a neighbour of size > 1, not split);
unsqueeze/squeeze shift the axis (squeezing the channel axis only when it holds one channel);
slice/select/narrow/index_select on the channel axis slice scale and zero point; expand/repeat
must not broadcast the channel axis; flip on the channel axis flips the qparams. Per-tensor
qparams pass through every shape-only op unchanged.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch

from .meta import QParams

aten = torch.ops.aten

SHAPE_OPS = {
    aten.permute.default, aten.transpose.int, aten.t.default, aten.reshape.default, aten.view.default,
    aten._unsafe_view.default,   # what a traced matmul's decomposition reshapes its product with
    aten.flatten.using_ints, aten.unflatten.int, aten.unsqueeze.default, aten.squeeze.dim,
    aten.squeeze.dims, aten.slice.Tensor, aten.select.int, aten.narrow.default,
    aten.index_select.default, aten.expand.default, aten.repeat.default, aten.flip.default,
    aten.contiguous.default, aten.clone.default,
}


def _norm(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _pick(qp: QParams, index) -> QParams:
    """Channels `index` (a slice, a list of ints, or one int -> per-tensor)."""
    if isinstance(index, int):
        return QParams((qp.scale[index],), (qp.zero_point[index],), qp.qmin, qp.qmax, qp.dtype, None)
    scale = tuple(qp.scale[i] for i in index) if isinstance(index, list) else qp.scale[index]
    zp = tuple(qp.zero_point[i] for i in index) if isinstance(index, list) else qp.zero_point[index]
    return replace(qp, scale=scale, zero_point=zp)


def _reshape_axis(in_shape, out_shape, axis: int) -> int | str:
    """The output dim holding the input's channel dim intact, or why there is none. In flat
    element order the channel spans [start, end); it survives iff both ends are output-dim
    boundaries with no boundary strictly between (else it was split) — if an end is not a
    boundary, it was merged with a neighbour."""
    start = math.prod(in_shape[:axis])
    end = start * in_shape[axis]
    bounds, acc = [1], 1
    for d in out_shape:
        acc *= d
        bounds.append(acc)
    if start in bounds and end in bounds:
        if any(start < b < end for b in bounds):
            return f"reshape {list(in_shape)} -> {list(out_shape)} splits the channel dimension {axis}"
        for j, d in enumerate(out_shape):
            if bounds[j] == start and d == in_shape[axis]:
                return j
    return f"reshape {list(in_shape)} -> {list(out_shape)} merges the channel dimension {axis}"


def _resolve_shape(shape, numel: int) -> list[int]:
    shape = list(shape)
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    return shape


def derive(target, args: tuple, in_shape: tuple[int, ...], qp: QParams) -> QParams | str:
    """QParams of `target(x, *args)` for x with `qp` and shape `in_shape`, or why not."""
    if target not in SHAPE_OPS:
        return f"{getattr(target, '__name__', target)} is not a shape-only op"
    if not qp.per_channel:
        return qp
    rank, axis = len(in_shape), qp.axis
    if any(not isinstance(d, int) for d in in_shape):
        return "symbolic shape"
    if target in (aten.contiguous.default, aten.clone.default):
        return qp
    if target is aten.permute.default:
        perm = [_norm(p, rank) for p in args[0]]
        return replace(qp, axis=perm.index(axis))
    if target in (aten.transpose.int, aten.t.default):
        d0, d1 = (0, 1) if target is aten.t.default else (_norm(args[0], rank), _norm(args[1], rank))
        return replace(qp, axis=d1 if axis == d0 else d0 if axis == d1 else axis)
    if target in (aten.reshape.default, aten.view.default, aten._unsafe_view.default, aten.flatten.using_ints,
                  aten.unflatten.int):
        out = _out_shape(target, args, in_shape)
        new = _reshape_axis(in_shape, out, axis)
        return new if isinstance(new, str) else replace(qp, axis=new)
    if target is aten.unsqueeze.default:
        d = _norm(args[0], rank + 1)
        return replace(qp, axis=axis + 1 if d <= axis else axis)
    if target in (aten.squeeze.dim, aten.squeeze.dims):
        dims = sorted({_norm(d, rank) for d in (args[0] if isinstance(args[0], (list, tuple)) else [args[0]])
                       if in_shape[_norm(d, rank)] == 1})
        if axis in dims:
            return _pick(qp, 0) if len(qp.scale) == 1 else "squeezes the channel axis"
        return replace(qp, axis=axis - sum(1 for d in dims if d < axis))
    if target in (aten.slice.Tensor, aten.narrow.default):
        dim = _norm(args[0] if args else 0, rank)
        if dim != axis:
            return qp
        if target is aten.narrow.default:
            start, end, step = args[1], args[1] + args[2], 1
        else:
            start, end, step = (list(args[1:]) + [None, None, 1])[:3]
        return _pick(qp, slice(start, end, step or 1))
    if target is aten.select.int:
        dim, index = _norm(args[0], rank), args[1]
        if dim == axis:
            return _pick(qp, _norm(index, in_shape[axis]))
        return replace(qp, axis=axis - 1 if dim < axis else axis)
    if target is aten.index_select.default:
        dim, index = _norm(args[0], rank), args[1]
        if dim != axis:
            return qp
        if not isinstance(index, torch.Tensor):
            return "index_select on the channel axis needs a constant index"
        return _pick(qp, [int(i) for i in index.tolist()])
    if target is aten.expand.default:
        sizes = list(args[0])
        shift = len(sizes) - rank
        if sizes[axis + shift] not in (-1, in_shape[axis]):
            return "expand broadcasts the channel axis"
        return replace(qp, axis=axis + shift)
    if target is aten.repeat.default:
        reps = list(args[0])
        shift = len(reps) - rank
        if reps[axis + shift] != 1:
            return "repeat replicates the channel axis"
        return replace(qp, axis=axis + shift)
    if target is aten.flip.default:
        dims = {_norm(d, rank) for d in args[0]}
        return _pick(qp, slice(None, None, -1)) if axis in dims else qp
    return "unhandled shape op"


def _out_shape(target, args, in_shape) -> list[int]:
    numel = math.prod(in_shape)
    if target is aten.flatten.using_ints:
        rank = len(in_shape)
        start = _norm(args[0] if args else 0, rank)
        end = _norm(args[1] if len(args) > 1 else -1, rank)
        return list(in_shape[:start]) + [math.prod(in_shape[start:end + 1])] + list(in_shape[end + 1:])
    if target is aten.unflatten.int:
        dim = _norm(args[0], len(in_shape))
        sizes = _resolve_shape(args[1], in_shape[dim])
        return list(in_shape[:dim]) + sizes + list(in_shape[dim + 1:])
    return _resolve_shape(args[0], numel)


def derive_concat(qps: list[QParams], dim: int, shapes: list[tuple[int, ...]]) -> QParams | str:
    """QParams of cat(xs, dim): along the channel axis per-channel qparams concatenate (same
    dtype and range); along another axis all qparams must be equal."""
    first = qps[0]
    if all(q == first for q in qps) and (not first.per_channel or first.axis != _norm(dim, len(shapes[0]))):
        return first
    if not all(q.per_channel and q.axis == _norm(dim, len(shapes[0])) and q.dtype == first.dtype
               and (q.qmin, q.qmax) == (first.qmin, first.qmax) for q in qps):
        return "concat of tensors with different qparams"
    return replace(first, scale=sum((q.scale for q in qps), ()), zero_point=sum((q.zero_point for q in qps), ()))


def derive_split(qp: QParams, dim: int, sizes: list[int], rank: int) -> list[QParams]:
    """QParams of each piece of split(x, sizes, dim): the inverse of concat."""
    if not qp.per_channel or qp.axis != _norm(dim, rank):
        return [qp] * len(sizes)
    out, start = [], 0
    for s in sizes:
        out.append(_pick(qp, slice(start, start + s)))
        start += s
    return out


SPLIT_OPS = {aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default, aten.unbind.int}


def split_dim(target, args: tuple, kwargs: dict, rank: int) -> int:
    """The dim a multi-output shape op (SPLIT_OPS) splits along; args exclude the tensor."""
    position = 0 if target is aten.unbind.int else 1
    dim = args[position] if len(args) > position else kwargs.get("dim", 0)
    return _norm(dim, rank)


def split_sizes(target, args: tuple, length: int) -> list[int]:
    """Piece lengths along the split dim; args exclude the tensor."""
    if target is aten.unbind.int:
        return [1] * length
    if target is aten.split_with_sizes.default:
        return list(args[0])
    each = -(-length // args[0]) if target is aten.chunk.default else args[0]
    return [min(each, length - i) for i in range(0, length, each)]


def derive_pieces(target, args: tuple, kwargs: dict, in_shape: tuple[int, ...], qp: QParams) -> list[QParams] | str:
    """QParams of each output of a SPLIT_OPS op on x with `qp`, or why not. unbind drops the
    dim: a channel axis there leaves one channel (per-tensor) per piece."""
    rank = len(in_shape)
    if qp.per_channel and any(not isinstance(d, int) for d in in_shape):
        return "symbolic shape"
    dim = split_dim(target, args, kwargs, rank)
    if not isinstance(in_shape[dim], int):
        return "split along a symbolic dim"
    if target is not aten.unbind.int:
        return derive_split(qp, dim, split_sizes(target, args, in_shape[dim]), rank)
    if not qp.per_channel:
        return [qp] * in_shape[dim]
    if qp.axis == dim:
        return [_pick(qp, i) for i in range(in_shape[dim])]
    return [replace(qp, axis=qp.axis - 1 if qp.axis > dim else qp.axis)] * in_shape[dim]
