"""CanonicalizeQDQ: replace the remaining quantized_decomposed Q/DQ nodes by qlower's canonical
quantize/dequantize, and drop DQ -> Q pairs that are value-preserving.

Preconditions: AttachQParams ran; LowerQDQ ran (what it could lower is lowered).
BEFORE:  d = quantized_decomposed.dequantize_per_tensor(q, s, zp, 0, 255, uint8)
         r = quantized_decomposed.quantize_per_tensor(x, s2, zp2, 0, 255, uint8)   (reciprocal math)
AFTER:   d = qlower.dequantize(q, [s], [zp])      r = qlower.quantize(x, [s2], [zp2], 0, 255, uint8)
         and qlower.quantize(qlower.dequantize(q, p), p) with identical p becomes q itself:
         Q(DQ(q)) == q for every q in [qmin, qmax] under the canonical numerics.
Postconditions: no quantized_decomposed op remains where parameters were constant; every value
in the graph follows `qlower.numerics`. Idempotent.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ..fx import add_constant, call, is_dequantize, is_quantize
from ..meta import QPARAMS_KEY
from .base import Pass, PassContext

qlower = torch.ops.qlower


class CanonicalizeQDQ(Pass):
    name = "canonicalize_qdq"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            qp = node.meta.get(QPARAMS_KEY)
            if qp is None or not (is_quantize(node) or is_dequantize(node)):
                continue
            with gm.graph.inserting_before(node):
                scale = add_constant(gm, qp.scale_tensor(), "scale")
                zp = add_constant(gm, qp.zero_point_tensor(), "zp")
                if is_quantize(node):
                    new = call(gm, qlower.quantize.default,
                               (node.args[0], scale, zp, qp.qmin, qp.qmax, qp.dtype, qp.axis), like=node)
                else:
                    new = call(gm, qlower.dequantize.default, (node.args[0], scale, zp, qp.axis), like=node)
            new.meta[QPARAMS_KEY] = qp
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
            changed = True
        changed |= self._drop_identity_pairs(gm, ctx)
        if changed:
            gm.graph.eliminate_dead_code()
        return changed

    @staticmethod
    def _drop_identity_pairs(gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if node.target is not qlower.quantize.default:
                continue
            src = node.args[0]
            if isinstance(src, Node) and src.target is qlower.dequantize.default and \
                    src.meta.get(QPARAMS_KEY) == node.meta.get(QPARAMS_KEY):
                node.replace_all_uses_with(src.args[0])
                ctx.rewrites["dequantize -> quantize pair removed"] += 1
                changed = True
        return changed
