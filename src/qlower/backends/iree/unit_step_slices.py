"""UnitStepSlices (iree legalization): a strided `aten.slice` that takes a single element along
its dim is written with step 1.

Why: iree-compile 3.13 rejects such a slice feeding a matmul when every other dim before it is 1
("expected result type to be 'memref<1x1x1x1x10xf32, strided<[10, 20, 10, 10, 1]>...' (mismatch
of result layout)"), found by the differential fuzzer (x[:, 0:1:2] @ w on a 1x1x10 input; the
cluster had been accepted by the capability and fell back whole). A one-element slice reads the
same element whatever its step.

Preconditions: the slice's input and output shapes are known (node.meta["val"]), the output size
along `dim` is a concrete 1 and its step a concrete integer > 1.
BEFORE:  y = aten.slice.Tensor(x, 1, 0, 1, 2)       # x 1x1x10 -> y 1x1x10
AFTER:   y = aten.slice.Tensor(x, 1, 0, 1, 1)
Near misses left alone: strided slices taking two or more elements (x[:, 0:3:2]); step-1 slices;
symbolic sizes or steps.
Postconditions: values identical (same start, same single element). Idempotent: a rewritten
slice has step 1.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule

from ...passes.base import Pass, PassContext

_SLICE = torch.ops.aten.slice.Tensor


def _single_element_strided(node) -> bool:
    if node.op != "call_function" or node.target is not _SLICE or len(node.args) < 5:
        return False
    step, val = node.args[4], node.meta.get("val")
    if not isinstance(step, int) or step <= 1 or val is None:
        return False
    dim = node.args[1] if len(node.args) > 1 else 0
    size = val.shape[dim] if isinstance(dim, int) and -val.dim() <= dim < val.dim() else None
    return isinstance(size, int) and size == 1


class UnitStepSlices(Pass):
    name = "unit_step_slices"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = 0
        for node in gm.graph.nodes:
            if _single_element_strided(node):
                node.update_arg(4, 1)
                changed += 1
        if changed:
            gm.recompile()
            ctx.rewrites["iree: step 1 on strided slices of one element (iree-compile 3.13 rejects some)"] += changed
        return bool(changed)
