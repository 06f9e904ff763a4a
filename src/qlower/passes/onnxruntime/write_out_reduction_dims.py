"""WriteOutReductionDims (onnxruntime legalization): amax / amin over "every dim" spelled as an
empty `dim` list get the list of every dim written out, which torchlib translates.

Why: torchlib 0.7.2's `aten_amax` / `aten_amin` require a non-empty `dim` (measured on OpInfo:
amax, amin and masked.amax/amin failed in the exporter and took their whole cluster to PyTorch).
`amax(x, [])` and `amax(x, range(rank))` are the same computation in PyTorch.

Preconditions: none (any captured graph).
BEFORE:  m = aten.amax(x, [], keepdim)            # x of rank r >= 1
AFTER:   m = aten.amax(x, [0, 1, ..., r - 1], keepdim)
BEFORE:  m = aten.amax(x, [], keepdim)            # x 0-d: the max of one value is that value
AFTER:   m = aten.clone(x)
BEFORE:  mn, mx = aten.aminmax(x, dim=None, keepdim)   (getitem 0 / 1)
AFTER:   mn = aten.amin(x, [0..r-1], keepdim)   mx = aten.amax(x, [0..r-1], keepdim)
A 0-d input with a dim (0 or -1) is a clone too (torchlib emits ReduceMax over axis 0 of a
0-d tensor, which ONNX Runtime rejects).
BEFORE:  n = aten.linalg_vector_norm(x, ord, dim, keepdim, dtype=d)   # x 0-d, ord != 0
AFTER:   n = aten.abs(aten._to_copy(x, dtype=d))   # |x| for every such ord (no copy without d)
(torchlib's ReduceL2 / ReduceL1 over axis 0 of a 0-d tensor: "axis must be in [-rank,
rank-1]", OpInfo's linalg.vector_norm; ord 0 counts non-zeros and is left alone).
BEFORE:  m = aten.amax(x, [-1], keepdim)          # x of rank r >= 1, a negative dim
AFTER:   m = aten.amax(x, [r - 1], keepdim)
(torchlib keeps amax / amin as functions whose ReduceMax reads the dims at run time, and ONNX
Runtime 1.31 returns an EMPTY input to a reduction unchanged when an axis is negative: `x.amax(-1)`
of a (0, 4, 5) tensor came back (0, 4, 5), eager (0, 4); the main graph's own Reduce* and ArgMax
nodes are fixed after translation, `translate._nonnegative_axes`.)
Near misses left alone: non-negative dims on a tensor of rank >= 1 (aminmax: a dim); other
reductions.
Postconditions: values identical. Idempotent: a rewritten node has a non-empty, non-negative `dim`.
"""
from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule

from ...fx import call, full_args, rank_of
from ..base import Pass, PassContext

aten = torch.ops.aten
REDUCTIONS = (aten.amax.default, aten.amin.default)   # aminmax is split into these first


class WriteOutReductionDims(Pass):
    name = "write_out_reduction_dims"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function":
                continue
            if node.target is aten.aminmax.default:
                parts = self._split_aminmax(gm, node, ctx)
                changed |= bool(parts)
                for part in parts:
                    self._make_explicit(part, ctx)
            elif node.target in REDUCTIONS:
                changed |= self._make_explicit(node, ctx)
            elif node.target is aten.linalg_vector_norm.default:
                changed |= self._scalar_norm(gm, node, ctx)
        if changed:
            gm.recompile()
        return changed

    @staticmethod
    def _make_explicit(node, ctx: PassContext) -> bool:
        x, dim, keepdim = full_args(node)[:3]
        rank = rank_of(x)
        dims = list(dim or [])
        if rank is None or (dims and rank > 0 and all(d >= 0 for d in dims)):
            return False
        if rank == 0:   # with or without a dim (0 / -1): torchlib's ReduceMax rejects axis 0 of a 0-d tensor
            node.target, node.args, node.kwargs = aten.clone.default, (x,), {}
        elif dims:
            node.args, node.kwargs = (x, [d % rank for d in dims], keepdim), {}
            ctx.rewrites["amax/amin dims written non-negative"] += 1
            return True
        else:
            node.args, node.kwargs = (x, list(range(rank)), keepdim), {}
        ctx.rewrites["amax/amin over every dim made explicit"] += 1
        return True

    @staticmethod
    def _scalar_norm(gm: GraphModule, node, ctx: PassContext) -> bool:
        x, ord_ = full_args(node)[:2]
        dtype = node.kwargs.get("dtype")
        if rank_of(x) != 0 or ord_ == 0:
            return False
        if dtype is not None and dtype != x.meta["val"].dtype:
            with gm.graph.inserting_before(node):
                x = call(gm, aten._to_copy.default, (x,), {"dtype": dtype}, like=node)
        node.target, node.args, node.kwargs = aten.abs.default, (x,), {}
        ctx.rewrites["norm of a 0-d tensor written as abs"] += 1
        return True

    @staticmethod
    def _split_aminmax(gm: GraphModule, node, ctx: PassContext) -> list:
        """aminmax over every dim: its two results as amin and amax nodes (made explicit next)."""
        x, dim, keepdim = full_args(node)[:3]
        users = list(node.users)
        if (dim is not None and rank_of(x) != 0) or not all(u.target is operator.getitem for u in users):
            return []
        with gm.graph.inserting_before(node):
            parts = [call(gm, target, (x, [], keepdim), like=node) for target in (aten.amin.default, aten.amax.default)]
        for user in users:
            user.replace_all_uses_with(parts[user.args[1]])
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        ctx.rewrites["aminmax over every dim split into amin and amax"] += 1
        return parts

