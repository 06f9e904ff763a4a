"""PropagateDequantize: move a dequantize of a non-constant integer tensor below shape-only ops,
so consumers (conv/linear/matmul) see DQ directly and the lowering can match them.

Preconditions: AttachQParams ran (and FoldQuantizedConstants, which handles constants).
BEFORE:  d = dequantize_per_tensor(q, s, zp)     r = aten.reshape(d, [B, -1])    y = linear(r, ...)
AFTER:   r = aten.reshape(q, [B, -1])             d = dequantize_per_tensor(r, s, zp)  y = linear(d, ...)
Multi-output shape ops (unbind, split, chunk) move the same way, one dequantize per piece:
BEFORE:  d = dequantize(q)   u = unbind(d)   a = getitem(u, 0)
AFTER:   u = unbind(q)       a' = getitem(u, 0)   a = dequantize(a')
QParams come from the shared `qlower.axis` helper; refusals are recorded.
Postconditions: shape ops run on integers; values unchanged (shape ops commute with DQ when the
qparams are re-derived). Fixpoint pass.
"""
from __future__ import annotations

import operator

from torch.fx import GraphModule, Node

from ..axis import SPLIT_OPS, derive_pieces
from ..fx import call
from ..meta import QPARAMS_KEY
from .base import Pass, PassContext
from .dq_through_shape import (constant_inputs, dequantize_node, derived_qparams, dq_input, integer_inputs,
                               static_args)


class PropagateDequantize(Pass):
    name = "propagate_dequantize"
    fixpoint = True

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op == "call_function" and node.target in SPLIT_OPS:
                changed |= _split_on_integers(gm, node, ctx, self.name)
                continue
            qp = derived_qparams(node)
            if qp is None or constant_inputs(gm, node) is not None:
                continue
            if isinstance(qp, str):
                ctx.refuse(self.name, node, qp)
                continue
            with gm.graph.inserting_before(node):
                moved = _shape_op_on_integers(gm, node)
                new = dequantize_node(gm, moved, qp, like=node)
            node.replace_all_uses_with(new)
            ctx.rewrites[f"dequantize moved below {node.target.__name__}"] += 1
            changed = True
        if changed:
            gm.graph.eliminate_dead_code()
        return changed


def _shape_op_on_integers(gm, node):
    qs = integer_inputs(node)
    if len(qs) > 1 or node.target.__name__.startswith("cat"):
        return call(gm, node.target, (qs, *node.args[1:]), node.kwargs, like=node)
    return call(gm, node.target, (qs[0], *node.args[1:]), node.kwargs, like=node)


def _split_on_integers(gm: GraphModule, node: Node, ctx: PassContext, name: str) -> bool:
    dq = dq_input(node)
    if dq is None or not static_args(node) or constant_inputs(gm, node) is not None \
            or not all(u.target is operator.getitem for u in node.users):
        return False
    qps = derive_pieces(node.target, tuple(node.args[1:]), node.kwargs, tuple(dq.meta["val"].shape),
                        dq.meta[QPARAMS_KEY])
    if isinstance(qps, str):
        ctx.refuse(name, node, qps)
        return False
    with gm.graph.inserting_before(node):
        pieces = call(gm, node.target, (dq.args[0], *node.args[1:]), node.kwargs, like=node)
    for user in list(node.users):
        with gm.graph.inserting_before(user):
            piece = call(gm, operator.getitem, (pieces, user.args[1]), like=user)
            new = dequantize_node(gm, piece, qps[user.args[1]], like=user)
        user.replace_all_uses_with(new)
    ctx.rewrites[f"dequantize moved below {node.target.__name__}"] += 1
    gm.graph.eliminate_dead_code()
    return True
