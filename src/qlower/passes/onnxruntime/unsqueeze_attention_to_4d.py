"""UnsqueezeAttentionTo4d (onnxruntime legalization): scaled_dot_product_attention on query/key/value of
rank 2 or 3 gets leading unit dims to rank 4, and its result loses them again.

Why: torchlib 0.7.2's `aten_scaled_dot_product_attention` asserts "only 4D query, key, and value
are supported", so a [B, L, E] attention (custom attention code, OpInfo's samples) would fail in the
exporter after the capability accepts it, and take its whole cluster to PyTorch. Attention
is independent per leading index, and a mask of rank <= the query's broadcasts from the right
against the unsqueezed shape as before, so the values are the same.

Preconditions: none (any captured graph).
BEFORE:  o = aten.scaled_dot_product_attention(q, k, v, mask, ...)        # q, k, v of rank r in {2, 3}
AFTER:   q4 = aten.unsqueeze(q, 0)   (4 - r times; likewise k, v)
         o4 = aten.scaled_dot_product_attention(q4, k4, v4, mask, ...)
         o  = aten.squeeze(o4, [0, ..])   (the 4 - r leading dims)
Near misses left alone: rank-4 attention; rank > 4 (torchlib's limit stays: the capability
refuses it, `capability.py`); query, key and value of different ranks; a mask of higher rank
than the query.
Postconditions: the same values (ONNX Runtime runs the same translation; PyTorch's CPU attention
kernel differs by rank, ~1e-7 apart). Idempotent: the rewritten attention is rank 4.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ...fx import call, full_args, rank_of
from ..base import Pass, PassContext

aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default


class UnsqueezeAttentionTo4d(Pass):
    name = "unsqueeze_attention_to_4d"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op == "call_function" and node.target is SDPA:
                changed |= self._to_rank_4(gm, node, ctx)
        if changed:
            gm.graph.lint()
            gm.recompile()
        return changed

    @staticmethod
    def _to_rank_4(gm: GraphModule, node: Node, ctx: PassContext) -> bool:
        q, k, v, mask = full_args(node)[:4]
        ranks = {rank_of(t) for t in (q, k, v)}
        if len(ranks) != 1 or next(iter(ranks)) not in (2, 3):
            return False
        rank = next(iter(ranks))
        if mask is not None and (rank_of(mask) is None or rank_of(mask) > rank):
            return False
        lead = 4 - rank
        with gm.graph.inserting_before(node):
            q4, k4, v4 = (_unsqueezed(gm, t, lead, node) for t in (q, k, v))
            attention = call(gm, SDPA, (q4, k4, v4, *node.args[3:]), node.kwargs, like=node)
            out = call(gm, aten.squeeze.dims, (attention, list(range(lead))), like=node)
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        ctx.rewrites[f"rank-{rank} attention unsqueezed to rank 4"] += 1
        return True


def _unsqueezed(gm: GraphModule, t: Node, times: int, like: Node) -> Node:
    for _ in range(times):
        t = call(gm, aten.unsqueeze.default, (t, 0), like=like)
    return t

