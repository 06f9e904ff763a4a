"""OuterProductsAsMul (iree legalization): a float matrix product whose reduction dim is 1 — an outer
product, one multiply per output element — is written as a broadcast `aten.mul`.

Why: IREE 3.13's global-optimization data tiling (the preferred path) computes some of them
wrongly, silently: `x[:, 2:3] @ w` with x [2, 12] or [4, 12] and w [1, 5] read the second row's
element from the wrong column (x[1, 0] instead of x[1, 2]; rows 1, 3, 5 and 8 were right, no
data tiling and the dispatch path always). Found by the IREE fuzz run (on
`clamp -> x[:, 11:12:2] @ w`, 5 of 10 outputs off by up to 0.18). An elementwise multiply has
nothing to tile, and is the cheaper kernel for an outer product anyway.

Preconditions: a call of aten.matmul / mm / bmm (a [.., M, 1] @ b [.., 1, N]), aten.linear
(x [.., 1], weight [N, 1], bias or None) or aten.addmm (bias, a [M, 1], b [1, N], alpha = beta =
1) on floating-point tensors of rank >= 2 (the input of linear: >= 1; its weight's N concrete)
whose reduction size is a concrete 1 (meta["val"]).
BEFORE:  y = aten.matmul.default(a, b)               # a [M, 1], b [1, N]
AFTER:   y = aten.mul.Tensor(a, b)                   # broadcast to [M, N]
BEFORE:  y = aten.linear.default(x, w, bias)         # x [.., 1], w [N, 1]
AFTER:   y = aten.add.Tensor(aten.mul.Tensor(x, aten.view.default(w, [N])), bias)
Near misses left alone: a reduction size of 2 or more or a symbolic one; a 1-D operand of
matmul (its result drops the dim); integer operands; addmm with alpha or beta.
Postconditions: the same values without a bias (one product, one rounding, as the matmul);
with a bias one rounding more than a kernel that fuses the add (within float tolerance, as any
float reassociation the engines do). Idempotent: no product with a unit reduction is left.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ...fx import call
from ..base import Pass, PassContext

_aten = torch.ops.aten
_PRODUCTS = (_aten.matmul.default, _aten.mm.default, _aten.bmm.default)


def _val(v):
    return v.meta.get("val") if isinstance(v, Node) else None


def _floats(*vals) -> bool:
    return all(isinstance(v, torch.Tensor) and v.dtype.is_floating_point for v in vals)


def _unit(size) -> bool:
    return isinstance(size, int) and size == 1


def _outer(node: Node) -> bool:
    """Is `node` a float product with a concrete reduction size of 1?"""
    if node.op != "call_function":
        return False
    if node.target in _PRODUCTS:
        a, b = (_val(v) for v in node.args[:2])
        return _floats(a, b) and a.dim() >= 2 and b.dim() >= 2 and _unit(a.shape[-1])
    if node.target is _aten.linear.default:
        x, w = (_val(v) for v in node.args[:2])
        return _floats(x, w) and x.dim() >= 1 and w.dim() == 2 and _unit(x.shape[-1]) and isinstance(w.shape[0], int)
    if node.target is _aten.addmm.default:
        a, b = (_val(v) for v in node.args[1:3])
        return _floats(a, b) and not node.kwargs and len(node.args) == 3 and _unit(a.shape[-1])
    return False


def _rewrite(gm: GraphModule, node: Node) -> Node:
    with gm.graph.inserting_before(node):
        if node.target in _PRODUCTS:
            return call(gm, _aten.mul.Tensor, node.args[:2], like=node)
        if node.target is _aten.addmm.default:
            bias, a, b = node.args
            return call(gm, _aten.add.Tensor, (call(gm, _aten.mul.Tensor, (a, b), like=node), bias), like=node)
        x, w = node.args[:2]
        bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        row = call(gm, _aten.view.default, (w, [_val(w).shape[0]]), like=node)
        y = call(gm, _aten.mul.Tensor, (x, row), like=node)
        return y if bias is None else call(gm, _aten.add.Tensor, (y, bias), like=node)


class OuterProductsAsMul(Pass):
    name = "outer_products_as_mul"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = 0
        for node in list(gm.graph.nodes):
            if not _outer(node):
                continue
            node.replace_all_uses_with(_rewrite(gm, node))
            gm.graph.erase_node(node)
            changed += 1
        if changed:
            ctx.rewrites["outer product (reduction size 1) written as a broadcast mul "
                         "(IREE's data tiling misread it)"] += changed
            gm.recompile()
        return bool(changed)
