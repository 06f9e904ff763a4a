"""Weight-only quantization of a captured float graph (QuantConfig.weight_only): the linears'
weights become b-bit codes in groups (passes/weight_only_linear.py), the activations stay float.

Order: AWQ scaling (method "awq" or "awq+gptq", folded into the float constants), then the
codes: GPTQ's (method "gptq" or "awq+gptq", from the calibration inputs' Hessians) or round
to nearest. No observers, no
Q/DQ nodes: the program holds `qlower.linear_weight_only` ops, which every backend lowers to
its weight-only kernel (docs/llm.md).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.fx import GraphModule, Node

from ..capture import check_example_inputs
from ..passes.base import PassContext
from ..passes.weight_only_linear import WeightOnlyLinear, constant, weight_targets
from .awq import scale_activations
from .config import QuantConfig, WeightOnly
from .gptq import gptq

aten = torch.ops.aten


class _Hessians(torch.fx.Interpreter):
    """Runs the float graph, summing X^T X (float64) of the inputs of the given linears, one
    matrix per distinct input node (q, k and v projections of one input share it)."""

    def __init__(self, gm: GraphModule, inputs: set[Node]):
        super().__init__(gm)
        self.inputs = inputs
        self.h: dict[Node, torch.Tensor] = {}

    def run_node(self, n: Node):
        out = super().run_node(n)
        if n in self.inputs:
            x = out.detach().reshape(-1, out.shape[-1]).to(torch.float64)
            h = x.T @ x
            self.h[n] = h if n not in self.h else self.h[n] + h
        return out


def hessians(gm: GraphModule, linears: list[Node], calibration: Iterable) -> dict[Node, torch.Tensor]:
    rec = _Hessians(gm, {lin.args[0] for lin in linears})
    with torch.no_grad():
        for batch in calibration:
            rec.run(*check_example_inputs(batch))
    return rec.h


def rewrite_weight_only(gm: GraphModule, calibration, config: QuantConfig) -> PassContext:
    """AWQ / GPTQ as `config.weight_only.method` says, then the rewrite; gm is changed in place
    (its constants replaced, never modified: ep.module() shares tensors with the user's model)."""
    scheme: WeightOnly = config.weight_only
    ctx = PassContext()
    targets = weight_targets(gm, scheme.embeddings, config.keep_float)
    if scheme.method in ("awq", "awq+gptq") and len(calibration):
        results = scale_activations(gm, calibration, scheme, set(targets))
        ctx.rewrites["AWQ: activation scales folded"] += sum(r.alpha > 0 for r in results)
    codes = {}
    if scheme.method in ("gptq", "awq+gptq") and len(calibration):
        linears = [n for nodes in targets.values() for n in nodes if n.target is aten.linear.default]
        h = hessians(gm, linears, calibration)
        for target, nodes in targets.items():
            if any(n.target is aten.embedding.default for n in nodes):
                continue   # an embedding's rows are read, not multiplied: round to nearest
            total = sum(h[n.args[0]] for n in nodes)
            w = constant(gm, target).detach().float()
            codes[target] = gptq(w, total, scheme.bits, scheme.group_size or w.shape[1], scheme.symmetric,
                                 scheme.gptq_damping)
        ctx.rewrites["GPTQ: weights quantized with error compensation"] += len(codes)
    WeightOnlyLinear(scheme.bits, scheme.group_size, scheme.symmetric, scheme.embeddings, codes,
                     config.keep_float).run(gm, ctx)
    return ctx
