"""MergeReductionDims (iree legalization): a float sum/mean over several dims is written as a
sum/mean over one dim of a view with those dims moved last and merged.

Why: iree-compile 3.13 fails on a reduction over two or more dims (or all of them) of a product
with a broadcast operand — `(x * w).mean((2, 3))`, `(x * w).sum((1, 3))`, `(x * w).mean()`:
"'vector.contract' op invalid accumulator/result vector shape", or a segmentation fault with
data tiling — and the cluster would fall back whole (found by the IREE fuzz run: RMSNorm's weight,
then a global average pool). The same reduction over one merged dim compiles
(measured: every failing form above, over one dim, compiles and matches).

Preconditions: `aten.mean` / `aten.sum` (`.dim` / `.dim_IntList` / whole-tensor) on a float
tensor of static shape, two or more reduced dims (no dim list: all of them), no dtype argument.
BEFORE:  y = aten.mean.dim(x, [2, 3], keepdim)                    # x [N, C, H, W]
AFTER:   y = aten.mean.dim(aten.reshape(x, [N, C, H*W]), [-1])    (then reshape to [N, C, 1, 1] if keepdim)
         (non-trailing or non-contiguous dims: an aten.permute moving them last first)
Near misses left alone: one reduced dim; symbolic shapes; integer tensors; a dtype argument.
Postconditions: the same elements summed (fp32 rounding as the engine orders it, as before).
Idempotent: every reduction it writes is over one dim.
"""
from __future__ import annotations

import math

import torch
from torch.fx import GraphModule, Node

from ...fx import call
from ..base import Pass, PassContext

_REDUCTIONS = (torch.ops.aten.mean.dim, torch.ops.aten.sum.dim_IntList)
_WHOLE = {torch.ops.aten.mean.default: torch.ops.aten.mean.dim,
          torch.ops.aten.sum.default: torch.ops.aten.sum.dim_IntList}


def _reduced_dims(node: Node) -> list[int] | None:
    """The sorted non-negative dims a multi-dim float reduction of static shape reduces, or None
    when the node is not one."""
    if node.op != "call_function" or node.target not in (*_REDUCTIONS, *_WHOLE) or node.kwargs.get("dtype") is not None:
        return None
    whole = node.target in _WHOLE
    if (len(node.args) > (1 if whole else 3)) and node.args[-1] is not None:
        return None
    val = node.args[0].meta.get("val") if isinstance(node.args[0], Node) else None
    if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point or val.dim() == 0:
        return None
    if not all(isinstance(d, int) for d in val.shape):
        return None
    dims = None if whole else node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    dims = list(range(val.dim())) if not dims else [d % val.dim() for d in dims]
    return sorted(set(dims)) if len(set(dims)) >= 2 else None


class MergeReductionDims(Pass):
    name = "merge_reduction_dims"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = 0
        for node in list(gm.graph.nodes):
            dims = _reduced_dims(node)
            if dims is None:
                continue
            x = node.args[0]
            shape = list(x.meta["val"].shape)
            keepdim = node.target in _REDUCTIONS and bool(node.args[2] if len(node.args) > 2
                                                          else node.kwargs.get("keepdim"))
            kept = [d for d in range(len(shape)) if d not in dims]
            with gm.graph.inserting_before(node):
                moved = x if kept + dims == list(range(len(shape))) else \
                    call(gm, torch.ops.aten.permute.default, (x, kept + dims), like=node)
                merged = call(gm, torch.ops.aten.reshape.default,
                              (moved, [shape[d] for d in kept] + [math.prod(shape[d] for d in dims)]), like=node)
                out = call(gm, _WHOLE.get(node.target, node.target), (merged, [-1]), like=node)
                if keepdim:
                    out = call(gm, torch.ops.aten.reshape.default, (out, list(node.meta["val"].shape)), like=node)
            node.replace_all_uses_with(out)
            gm.graph.erase_node(node)
            changed += 1
        if changed:
            ctx.rewrites["multi-dim reduction written over one merged dim (iree-compile fails on it)"] += changed
            gm.graph.eliminate_dead_code()
            gm.recompile()
        return bool(changed)
