"""WriteOutEmbeddingRenorm (onnxruntime legalization): `embedding(..., max_norm=m)`'s in-place
renormalization of the caller's weight, `aten.embedding_renorm_`, becomes the renormalized
weight computed in ATen ops torchlib translates, read by everything after it, and written back
into the caller's tensor by a `copy_` that stays in PyTorch (an input write-back, as
WriteOutTrainingBatchNorm's).

Why: an in-place write into a graph input pins the op to PyTorch (OpInfo's
nn.functional.embedding with max_norm ran there, and with it the lookup).

Preconditions: meta['val'] on the inputs.
BEFORE:  v = aten.detach(w);  aten.embedding_renorm_(v, idx, max_norm, norm_type);  y = aten.embedding(w, idx)
AFTER:   norms = ||w[r]||_p per row;  used = rows idx names
         scale = where(used and norms > max_norm, max_norm / (norms + 1e-7), 1)   (in float64, as eager)
         w2 = w * scale[:, None];  y = aten.embedding(w2, idx);  aten.copy_(w, w2)   # write-back
Near misses left alone: a renorm of anything but a graph input (or a detach / alias of one), a
weight of another rank than 2.
Postconditions: the same values; the caller's weight renormalized as eager's. Idempotent: no
embedding_renorm_ is left.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ...fx import call
from ..base import Pass, PassContext
from ..functionalize_state import WRITE_BACK

A = torch.ops.aten
_VIEWS = (A.detach.default, A.alias.default)


def _input_renormalized(node: Node) -> Node | None:
    """The graph input a renorm writes into (through a detach / alias view), or None."""
    if node.op != "call_function" or node.target is not A.embedding_renorm_.default:
        return None
    target = node.args[0]
    while isinstance(target, Node) and target.op == "call_function" and target.target in _VIEWS:
        target = target.args[0]
    val = target.meta.get("val") if isinstance(target, Node) else None
    if target is None or target.op != "placeholder" or not isinstance(val, torch.Tensor) or val.dim() != 2:
        return None
    return target


class WriteOutEmbeddingRenorm(Pass):
    name = "write_out_embedding_renorm"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        for node in list(gm.graph.nodes):
            weight = _input_renormalized(node)
            if weight is None:
                continue
            with gm.graph.inserting_before(node):
                renormed = _renormed(gm, node, weight)
            for user in list(weight.users):
                if order.get(user, -1) > order[node]:
                    user.replace_input_with(weight, renormed)
            output = next(n for n in gm.graph.nodes if n.op == "output")
            with gm.graph.inserting_before(output):
                write = call(gm, A.copy_.default, (weight, renormed), like=node)
                write.meta[WRITE_BACK] = True
            gm.graph.erase_node(node)
            ctx.rewrites["embedding_renorm_ spelled out"] += 1
            changed = True
        if changed:
            gm.graph.eliminate_dead_code()
            gm.recompile()
        return changed


def _renormed(gm: GraphModule, node: Node, weight: Node) -> Node:
    _, indices, max_norm, norm_type = node.args
    c = lambda target, *args, **kwargs: call(gm, target, args, kwargs, like=node)
    rows = weight.meta["val"].shape[0]
    hit = c(A.full.default, [rows], False, dtype=torch.bool)
    used = c(A.index_put.default, hit, [c(A.reshape.default, indices, [-1])],
             c(A.full.default, [], True, dtype=torch.bool))
    norms = c(A._to_copy.default, c(A.linalg_vector_norm.default, weight, float(norm_type), [1]), dtype=torch.float64)
    scale = c(A.reciprocal.default, c(A.div.Scalar, c(A.add.Scalar, norms, 1e-7), float(max_norm)))
    over = c(A.logical_and.default, used, c(A.gt.Scalar, norms, float(max_norm)))
    scale = c(A.where.self, over, scale, c(A.ones_like.default, scale))
    scale = c(A._to_copy.default, c(A.unsqueeze.default, scale, 1), dtype=weight.meta["val"].dtype)
    return c(A.mul.Tensor, weight, scale)
