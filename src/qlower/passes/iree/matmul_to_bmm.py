"""MatmulToBmm (iree legalization): `aten.matmul` of two rank-3 operands with the same batch
size is written as `aten.bmm`.

Why: in an int8 (TOSA) cluster each float op is imported alone, and torch-mlir (iree-compile
3.13) cannot decompose a rank-3 x rank-3 `aten.matmul` whose batch dim is dynamic ("found an op
that was marked as backend illegal ... DecomposeComplexOps being unable to decompose this op");
`aten.bmm` on the same operands lowers. Such a matmul is what the integer lowering leaves in
float whenever its reduction dim is dynamic — `softmax(q kᵀ) @ v` with the sequence dynamic —
so the whole int8 cluster would fall back (measured: rank-3 x rank-2, rank-4 x
rank-4 and static-batch rank-3 matmuls lower as they are). For equal batch sizes the two ops
are one function.

Preconditions: a call of `aten.matmul.default` whose two operands are rank-3 tensors (meta
"val") with batch sizes that are the same int or the same symbol.
BEFORE:  y = aten.matmul.default(a, b)      # a [B, M, K], b [B, K, N]
AFTER:   y = aten.bmm.default(a, b)
Near misses left alone: a broadcast batch ([1, M, K] @ [B, K, N]: bmm does not broadcast), other
ranks, `aten.bmm` already.
Postconditions: the same values (bmm and matmul are the same product for equal batches).
Idempotent: no rank-3 x rank-3 `aten.matmul` with equal batches is left.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ..base import Pass, PassContext

_aten = torch.ops.aten


def _same_batch_rank3(node: Node) -> bool:
    if node.op != "call_function" or node.target is not _aten.matmul.default:
        return False
    vals = [a.meta.get("val") if isinstance(a, Node) else None for a in node.args[:2]]
    return (all(isinstance(v, torch.Tensor) and v.dim() == 3 for v in vals)
            and str(vals[0].shape[0]) == str(vals[1].shape[0]))


class MatmulToBmm(Pass):
    name = "matmul_to_bmm"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = 0
        for node in gm.graph.nodes:
            if _same_batch_rank3(node):
                node.target = _aten.bmm.default
                changed += 1
        if changed:
            ctx.rewrites["rank-3 matmul written as bmm "
                         "(torch-mlir cannot decompose it with a dynamic batch)"] += changed
            gm.recompile()
        return bool(changed)
