"""FoldQuantizedConstants: evaluate shape-only ops on quantized constants at compile time and
re-derive their QParams (per-channel axis included) with the shared `qlower.axis` helper.

Preconditions: AttachQParams ran.
BEFORE:  w  = get_attr w_i8 [N, K]        wd = dequantize_per_channel(w, s[N], zp[N], axis=0)
         wt = aten.t(wd)                   y  = aten.matmul(xd, wt)
AFTER:   w' = get_attr (w_i8.t()) [K, N]   wd' = dequantize_per_channel(w', s[N], zp[N], axis=1)
         y  = aten.matmul(xd, wd')
Also cat of dequantized constants along the channel axis (qparams concatenate). Refuses, with a
recorded reason, when the channel dimension would be merged, split or broadcast. Constants
folded from the same storage with the same op are shared (tied weights stay tied). Arithmetic
on quantized tensors is never folded.
Postconditions: no shape op sits between a quantized constant and its consumer unless refused.
Fixpoint pass (chains fold one op per step). Values are bit-identical: only integers move.
"""
from __future__ import annotations

from torch.fx import GraphModule

from ..fx import add_constant
from .base import Pass, PassContext
from .dq_through_shape import apply_on_integers, constant_inputs, dequantize_node, derived_qparams


class FoldQuantizedConstants(Pass):
    name = "fold_quantized_constants"
    fixpoint = True

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        cache = ctx.__dict__.setdefault("_folded_constants", {})
        changed = False
        for node in list(gm.graph.nodes):
            qp = derived_qparams(node)
            if qp is None:
                continue
            values = constant_inputs(gm, node)
            if values is None:
                continue
            if isinstance(qp, str):
                ctx.refuse(self.name, node, qp)
                continue
            key = (tuple(v.untyped_storage().data_ptr() for v in values), tuple(v.shape for v in values),
                   node.target, repr(node.args[1:]), repr(node.kwargs))
            with gm.graph.inserting_before(node):
                if key in cache and hasattr(gm, cache[key][0]):
                    const = gm.graph.get_attr(cache[key][0])  # tied: same folded buffer
                    const.meta["val"] = cache[key][1]
                else:
                    const = add_constant(gm, apply_on_integers(node, values).contiguous(), "folded")
                    cache[key] = (str(const.target), const.meta["val"])
                new = dequantize_node(gm, const, qp, like=node)
            node.replace_all_uses_with(new)
            ctx.rewrites[f"folded {node.target.__name__} on a quantized constant"] += 1
            changed = True
        if changed:
            gm.graph.eliminate_dead_code()
        return changed

