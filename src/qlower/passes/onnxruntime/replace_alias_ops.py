"""ReplaceAliasOps (onnxruntime legalization): ATen's alias ops (`divide`, `subtract`,
`multiply`, `true_divide`) become the ops they alias (`div`, `sub`, `mul`).

Why: torch.export keeps `torch.divide(x, n)` as `aten.divide.Tensor`; torchlib translates it
directly, but torch.onnx's type-promotion pass only knows the canonical names, so a float divided
by an int64 count became `Div(float, int64)`, which ONNX Runtime rejects ("Type parameter (T) of
Optype (Div) bound to different types"; OpInfo's masked.std / masked.var: the whole cluster fell
back). Each alias has its target's schema: the same arguments, the same values.

Preconditions: none (any captured graph).
BEFORE:  y = aten.divide.Tensor(x, n)       (likewise .Scalar, .Tensor_mode; subtract, multiply,
                                             true_divide)
AFTER:   y = aten.div.Tensor(x, n)
Near misses left alone: every other op (the canonical ones included).
Postconditions: values identical. Idempotent: no alias is left.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule

from ..base import Pass, PassContext

aten = torch.ops.aten
ALIASES = {
    aten.divide.Tensor: aten.div.Tensor, aten.divide.Scalar: aten.div.Scalar,
    aten.divide.Tensor_mode: aten.div.Tensor_mode, aten.divide.Scalar_mode: aten.div.Scalar_mode,
    aten.true_divide.Tensor: aten.div.Tensor, aten.true_divide.Scalar: aten.div.Scalar,
    aten.subtract.Tensor: aten.sub.Tensor, aten.subtract.Scalar: aten.sub.Scalar,
    aten.multiply.Tensor: aten.mul.Tensor, aten.multiply.Scalar: aten.mul.Scalar,
}


class ReplaceAliasOps(Pass):
    name = "replace_alias_ops"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in gm.graph.nodes:
            target = ALIASES.get(node.target) if node.op == "call_function" else None
            if target is not None:
                ctx.rewrites[f"{node.target.name()} -> {target.name()}"] += 1
                node.target = target
                changed = True
        if changed:
            gm.recompile()
        return changed
