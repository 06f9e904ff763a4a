"""MaskedSelectBounds: correct the upper bound torch.export asserts on masked_select's size.

torch 2.13's meta function bounds masked_select's data-dependent size by `self.numel()`, but a
mask that broadcasts `self` to a larger shape selects up to the broadcast shape's numel: the
exported program asserts a bound its own example inputs break (measured: x [10], mask [10, 10]
selecting 47 elements; `ep.module()(x, mask)` raises "Runtime assertion failed for expression
u0 <= 10", eager returns 47 values; OpInfo's masked_select sample 2 was qlower's one error row).

Preconditions: static shapes for masked_select's operands.
BEFORE:  s = masked_select(x, m);  n = sym_size(s, 0);  _assert_scalar(n <= x.numel(), "... u0 <= 10 ...")
AFTER:   s = masked_select(x, m);  n = sym_size(s, 0);  _assert_scalar(n <= numel(broadcast(x, m)), "... u0 <= 100 ...")
Not fired: a mask that does not enlarge `self` (the bound is right), a bound compared with
something other than that numel, symbolic operand shapes.
Postconditions: every such assertion holds for every pair of inputs eager accepts. Idempotent
(a corrected bound is the broadcast numel); values unchanged.
"""
from __future__ import annotations

import math
import operator

import torch
from torch.fx import GraphModule, Node

from .base import Pass, PassContext


def _static_numel(value) -> int | None:
    shape = getattr(value, "shape", None)
    if shape is None or not all(isinstance(s, int) for s in shape):
        return None
    return math.prod(shape)


def _enlarged_bound(node: Node) -> tuple[int, int] | None:
    """(export's bound, the true one) where the mask broadcasts `self` to more elements."""
    x, mask = (a.meta.get("val") if isinstance(a, Node) else None for a in node.args[:2])
    exported, own = _static_numel(x), _static_numel(mask)
    if exported is None or own is None:
        return None
    true = math.prod(torch.broadcast_shapes(x.shape, mask.shape))
    return (exported, true) if true > exported else None


def _bound_checks(node: Node, exported: int) -> list[Node]:
    """The `size <= exported` comparisons on masked_select's size."""
    sizes = [u for u in node.users if u.target is torch.ops.aten.sym_size.int and u.args[1] == 0]
    return [c for s in sizes for c in s.users
            if c.target is operator.le and c.args[0] is s and c.args[1] == exported]


class MaskedSelectBounds(Pass):
    name = "masked_select_bounds"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in gm.graph.nodes:
            if node.op != "call_function" or node.target is not torch.ops.aten.masked_select.default:
                continue
            bounds = _enlarged_bound(node)
            if bounds is None:
                continue
            exported, true = bounds
            for check in _bound_checks(node, exported):
                check.args = (check.args[0], true)
                for user in list(check.users):
                    if user.target is torch.ops.aten._assert_scalar.default and isinstance(user.args[1], str):
                        user.args = (user.args[0], user.args[1].replace(f"<= {exported} ", f"<= {true} "))
                ctx.rewrites["masked_select bound corrected (broadcast mask)"] += 1
                changed = True
        if changed:
            gm.recompile()
        return changed
