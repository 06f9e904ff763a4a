"""FoldQuantizedConstants: evaluate shape-only ops on quantized constants at compile time and
re-derive their QParams (per-channel axis included) with the shared `qlower.axis` helper.

Preconditions: AttachQParams ran.
BEFORE:  w  = get_attr w_i8 [N, K]        wd = dequantize_per_channel(w, s[N], zp[N], axis=0)
         wt = aten.t(wd)                   y  = aten.matmul(xd, wt)
AFTER:   w' = get_attr (w_i8.t()) [K, N]   wd' = dequantize_per_channel(w', s[N], zp[N], axis=1)
         y  = aten.matmul(xd, wd')
Also cat of dequantized constants along the channel axis (qparams concatenate) and split/chunk
/unbind (each piece gets its slice of the qparams). Refuses, with a
recorded reason, when the channel dimension would be merged, split or broadcast. Constants
folded from the same storage with the same op are shared (tied weights stay tied). Arithmetic
on quantized tensors is never folded.
Postconditions: no shape op sits between a quantized constant and its consumer unless refused.
Fixpoint pass (chains fold one op per step). Values are bit-identical: only integers move.
"""
from __future__ import annotations

from torch.fx import GraphModule

import operator

import torch

from ..axis import SPLIT_OPS, derive_pieces, split_dim, split_sizes
from ..fx import add_constant, constant_value, is_dequantize
from ..meta import QPARAMS_KEY
from .base import Pass, PassContext
from .dq_through_shape import apply_on_integers, constant_inputs, dequantize_node, derived_qparams


class FoldQuantizedConstants(Pass):
    name = "fold_quantized_constants"
    fixpoint = True

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        cache = ctx.folded_constants
        changed = False
        for node in list(gm.graph.nodes):
            if node.op == "call_function" and node.target in SPLIT_OPS:
                changed |= self._fold_split(gm, node, ctx)
                continue
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

    def _fold_split(self, gm: GraphModule, node, ctx: PassContext) -> bool:
        """split/chunk/unbind of a quantized constant: every piece becomes its own folded constant whose
        qparams are the matching slice (on the channel axis) or the same (elsewhere)."""
        src = node.args[0]
        if (not (is_dequantize(src) and QPARAMS_KEY in src.meta)
                or not all(u.target is operator.getitem for u in node.users)):
            return False
        value = constant_value(gm, src.args[0])
        if value is None:
            return False
        qps = derive_pieces(node.target, tuple(node.args[1:]), node.kwargs, tuple(value.shape), src.meta[QPARAMS_KEY])
        if isinstance(qps, str):
            ctx.refuse(self.name, node, qps)
            return False
        dim = split_dim(node.target, tuple(node.args[1:]), node.kwargs, value.dim())
        pieces = torch.split(value, split_sizes(node.target, tuple(node.args[1:]), value.shape[dim]), dim)
        if node.target is torch.ops.aten.unbind.int:
            pieces = [p.squeeze(dim) for p in pieces]
        for user in list(node.users):
            i = user.args[1]
            with gm.graph.inserting_before(user):
                const = add_constant(gm, pieces[i].contiguous(), "folded")
                new = dequantize_node(gm, const, qps[i], like=user)
            user.replace_all_uses_with(new)
        ctx.rewrites[f"folded {node.target.__name__} on a quantized constant"] += 1
        gm.graph.eliminate_dead_code()
        return True
