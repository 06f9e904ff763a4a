"""ExplicitReductionDims (onnxruntime legalization): amax / amin over "every dim" spelled as an
empty `dim` list get the list of every dim written out, which torchlib translates.

Why: torchlib 0.7.2's `aten_amax` / `aten_amin` require a non-empty `dim` (measured on OpInfo:
amax, amin and masked.amax/amin failed in the exporter and took their whole cluster to PyTorch).
`amax(x, [])` and `amax(x, range(rank))` are the same computation in PyTorch.

Preconditions: none (any captured graph).
BEFORE:  m = aten.amax(x, [], keepdim)            # x of rank r >= 1
AFTER:   m = aten.amax(x, [0, 1, ..., r - 1], keepdim)
Near misses left alone: a non-empty `dim`; a 0-d input (no dim to name; the capability's
translation check decides); other reductions.
Postconditions: values identical. Idempotent: a rewritten node has a non-empty `dim`.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule

from ...fx import full_args
from ...passes.base import Pass, PassContext

aten = torch.ops.aten
REDUCTIONS = (aten.amax.default, aten.amin.default)


class ExplicitReductionDims(Pass):
    name = "explicit_reduction_dims"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in gm.graph.nodes:
            if node.op != "call_function" or node.target not in REDUCTIONS:
                continue
            x, dim = full_args(node)[:2]
            rank = x.meta["val"].dim() if "val" in getattr(x, "meta", {}) else 0
            if list(dim or []) or rank == 0:
                continue
            keepdim = full_args(node)[2]
            node.args, node.kwargs = (x, list(range(rank)), keepdim), {}
            ctx.rewrites["amax/amin over every dim made explicit"] += 1
            changed = True
        if changed:
            gm.recompile()
        return changed
