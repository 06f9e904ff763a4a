"""InlineGradModeRegions: splice `wrap_with_set_grad_enabled` subgraphs into the main graph.

torch.export keeps code run under `torch.no_grad()` / `torch.enable_grad()` (transformers'
rotary embeddings, for one) as a higher-order op calling a submodule. qlower compiles for
inference, where the grad mode changes nothing, so the region's ops are inlined and can be
folded, quantized and clustered like any others.

Preconditions: none.
BEFORE:  out = wrap_with_set_grad_enabled(False, submod_3, x, inv_freq);  cos = out[0]
AFTER:   m = aten.mul(x, inv_freq) ... cos = aten.cos(...)      (submod_3's nodes, inlined)
Not fired: other higher-order ops; regions whose subgraph reads its own attributes.
Postconditions: no wrap_with_set_grad_enabled node remains. Idempotent; values unchanged.
"""
from __future__ import annotations

import operator

from torch._higher_order_ops.wrap import wrap_with_set_grad_enabled
from torch.fx import GraphModule, Node

from ..fx import splice
from .base import Pass, PassContext


def _inline(gm: GraphModule, node: Node) -> bool:
    _, sub_ref, *args = node.args
    sub = getattr(gm, sub_ref.target)
    if any(n.op == "get_attr" for n in sub.graph.nodes) or \
            any(u.target is not operator.getitem for u in node.users):
        return False
    results = splice(gm, sub.graph, args, node, lambda s, env: gm.graph.node_copy(s, env.__getitem__))
    for user in list(node.users):
        user.replace_all_uses_with(results[user.args[1]])
        gm.graph.erase_node(user)
    gm.graph.erase_node(node)
    return True


class InlineGradModeRegions(Pass):
    name = "inline_grad_mode_regions"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op == "call_function" and node.target is wrap_with_set_grad_enabled and _inline(gm, node):
                ctx.rewrites["grad-mode region inlined"] += 1
                changed = True
        if changed:
            gm.graph.eliminate_dead_code()
            gm.delete_all_unused_submodules()
        return changed
