"""PropagateDequantize: move a dequantize of a non-constant integer tensor below shape-only ops,
so consumers (conv/linear/matmul) see DQ directly and the lowering can match them.

Preconditions: AttachQParams ran (and FoldQuantizedConstants, which handles constants).
BEFORE:  d = dequantize_per_tensor(q, s, zp)     r = aten.reshape(d, [B, -1])    y = linear(r, ...)
AFTER:   r = aten.reshape(q, [B, -1])             d = dequantize_per_tensor(r, s, zp)  y = linear(d, ...)
QParams come from the shared `qlower.axis` helper; refusals are recorded.
Postconditions: shape ops run on integers; values unchanged (shape ops commute with DQ when the
qparams are re-derived). Fixpoint pass.
"""
from __future__ import annotations

from torch.fx import GraphModule

from ..fx import call
from .base import Pass, PassContext
from .dq_through_shape import constant_inputs, dequantize_node, derived_qparams, integer_inputs


class PropagateDequantize(Pass):
    name = "propagate_dequantize"
    fixpoint = True

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
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
