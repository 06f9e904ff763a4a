"""UnitStepSingleElementSlices (iree legalization): a strided `aten.slice` that takes a single element along
its dim is written with step 1.

Why: iree-compile 3.13 rejects such a slice feeding a matmul when every other dim before it is 1
("expected result type to be 'memref<1x1x1x1x10xf32, strided<[10, 20, 10, 10, 1]>...' (mismatch
of result layout)"), found by the differential fuzzer (x[:, 0:1:2] @ w on a 1x1x10 input; the
cluster is accepted by the capability and falls back whole). A one-element slice reads the
same element whatever its step.

Preconditions: the slice's input and output shapes are known (meta["val"]), the output size
along `dim` is a concrete 1, the input size there, the start and the step (> 1) concrete ints.
(The end becomes start + 1: keeping it would turn x[:, 0:2:2] into x[:, 0:2], two elements —
a wrong answer; tests/test_fuzz.py checks an end past start + 1.)
BEFORE:  y = aten.slice.Tensor(x, 1, 0, 2, 2)       # x 1x2x10 -> y 1x1x10 (element 0)
AFTER:   y = aten.slice.Tensor(x, 1, 0, 1, 1)       # start, start + 1, step 1
Near misses left alone: strided slices taking two or more elements (x[:, 0:3:2]); step-1 slices;
symbolic sizes or steps.
Postconditions: values identical (the same single element, at its clamped start). Idempotent:
a rewritten slice has step 1.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule

from ..base import Pass, PassContext

_SLICE = torch.ops.aten.slice.Tensor


def _single_element_start(node) -> int | None:
    """The index of the one element a strided slice takes, or None when the node is not such
    a slice (or its input size along the dim, its start or its step is not a concrete int)."""
    if node.op != "call_function" or node.target is not _SLICE or len(node.args) < 5:
        return None
    x, dim, start, step, val = node.args[0], node.args[1], node.args[2], node.args[4], node.meta.get("val")
    source = getattr(x, "meta", {}).get("val")
    if not isinstance(step, int) or step <= 1 or val is None or source is None or not isinstance(dim, int):
        return None
    if not -val.dim() <= dim < val.dim():
        return None
    size_out, size_in = val.shape[dim], source.shape[dim]
    if not (isinstance(size_out, int) and size_out == 1 and isinstance(size_in, int)):
        return None
    start = 0 if start is None else start
    if not isinstance(start, int):
        return None
    return min(max(start + size_in if start < 0 else start, 0), size_in - 1)   # Python's clamping


class UnitStepSingleElementSlices(Pass):
    name = "unit_step_single_element_slices"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = 0
        for node in gm.graph.nodes:
            index = _single_element_start(node)
            if index is not None:
                node.args = (node.args[0], node.args[1], index, index + 1, 1)
                changed += 1
        if changed:
            gm.recompile()
            ctx.rewrites["iree: step 1 on strided slices of one element (iree-compile 3.13 rejects some)"] += changed
        return bool(changed)
