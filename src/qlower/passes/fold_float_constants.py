"""FoldFloatConstants: evaluate pure ops whose every tensor input is a float constant.

Preconditions: none (runs first).
BEFORE:  w = get_attr w_f32   wt = aten.t(w)   s = aten.mul.Tensor(wt, 0.5)   y = aten.linear(x, s)
AFTER:   c = get_attr (w_f32.t() * 0.5)                                       y = aten.linear(x, c)
Only deterministic, non-mutating ATen ops on float tensors; never ops on integer (quantized)
tensors — those are FoldQuantizedConstants' job, which keeps their qparams right — and never
quantize/dequantize themselves.
Postconditions: no call whose inputs are all float constants remains. Fixpoint; values equal
what PyTorch computes at run time (same kernels, evaluated once).
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ..fx import add_constant, constant_value
from .base import Pass, PassContext

_NONDETERMINISTIC = {"rand", "randn", "randint", "randperm", "bernoulli", "dropout", "normal", "uniform",
                     "empty", "empty_like", "new_empty", "empty_strided"}


def _foldable(gm: GraphModule, node: Node) -> list[torch.Tensor] | None:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    schema = node.target._schema
    if node.target.namespace != "aten" or schema.is_mutable or len(schema.returns) != 1 \
            or schema.name.split("::")[-1] in _NONDETERMINISTIC or not node.users:
        return None
    inputs = node.all_input_nodes
    values = [constant_value(gm, n) for n in inputs]
    if not inputs or any(v is None or not v.is_floating_point() for v in values):
        return None
    return values


class FoldFloatConstants(Pass):
    name = "fold_float_constants"
    fixpoint = True

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            values = _foldable(gm, node)
            if values is None:
                continue
            env = dict(zip(node.all_input_nodes, values))
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            with torch.no_grad():
                result = node.target(*args, **kwargs)
            if not isinstance(result, torch.Tensor):
                continue
            with gm.graph.inserting_before(node):
                const = add_constant(gm, result.contiguous(), "const")
            node.replace_all_uses_with(const)
            ctx.rewrites[f"folded {node.target.__name__} on float constants"] += 1
            changed = True
        if changed:
            gm.graph.eliminate_dead_code()
        return changed
