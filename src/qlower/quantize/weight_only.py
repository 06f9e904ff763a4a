"""Weight-only quantization of a captured float graph (QuantConfig.weight_only): the linears'
weights become b-bit codes in groups (passes/weight_only_linear.py), the activations stay float.

Order: AWQ scaling (method "awq" or "awq+gptq", folded into the float constants), AWQ's
clipping (`awq_clip`: the clamped weights replace the float constants), then the codes: GPTQ's
(method "gptq" or "awq+gptq", from the calibration inputs' Hessians) or round to nearest. The
Hessians X^T X (clipping and GPTQ) are measured once, on the float graph after AWQ's scaling.
No observers, no Q/DQ nodes: the program holds `qlower.linear_weight_only` ops, which every
backend lowers to its weight-only kernel (docs/llm.md).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.fx import GraphModule, Node

from .. import numerics
from ..capture import check_example_inputs
from ..passes.base import PassContext
from ..passes.weight_only_linear import WeightOnlyLinear, constant, weight_targets
from .awq import clip_ratios, scale_activations
from .config import QuantConfig, WeightOnly
from .gptq import gptq_batched
from .smoothquant import set_constant

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


def _linears(targets: dict[str, list[Node]]) -> list[Node]:
    return [n for nodes in targets.values() for n in nodes if n.target is aten.linear.default]


def _clip(gm: GraphModule, targets: dict[str, list[Node]], h: dict[Node, torch.Tensor], scheme: WeightOnly) -> int:
    """AWQ's clipping of every weight in `targets` read only by linears (an embedding's rows are
    read, not multiplied); the clamped weight replaces the constant. Returns how many changed."""
    changed = 0
    for target, nodes in targets.items():
        if any(n.target is aten.embedding.default for n in nodes):
            continue
        w = constant(gm, target).detach().float()
        ratio = clip_ratios(w, sum(h[n.args[0]] for n in nodes), scheme)
        if bool((ratio < 1).any()):
            set_constant(gm, target, numerics.clip_weight_groups(w, ratio, scheme.group_size or w.shape[1]))
            changed += 1
    return changed


def _gptq_codes(gm: GraphModule, targets: dict[str, list[Node]], h: dict[Node, torch.Tensor],
                scheme: WeightOnly) -> dict:
    """GPTQ codes of every linear weight in `targets`. Weights read by one linear each and
    sharing its input (q, k, v) are quantized as one matrix (their rows stacked: GPTQ treats rows
    independently given H); matrices of one shape (the same layer of every block) run batched."""
    units: dict[object, tuple[list[str], torch.Tensor]] = {}
    for target, nodes in targets.items():
        if any(n.target is aten.embedding.default for n in nodes):
            continue   # an embedding's rows are read, not multiplied: round to nearest
        if len(nodes) == 1:
            key = nodes[0].args[0]
            names, hess = units.get(key, ([], h[key]))
            units[key] = (names + [target], hess)
        else:
            units[target] = ([target], sum(h[n.args[0]] for n in nodes))
    buckets: dict[tuple, list[tuple[list[str], torch.Tensor, torch.Tensor]]] = {}
    for names, hess in units.values():
        w = torch.cat([constant(gm, t).detach().float() for t in names])
        buckets.setdefault(tuple(w.shape), []).append((names, w, hess))
    codes = {}
    for (_, k), items in buckets.items():
        group = scheme.group_size or k
        c, s, z = gptq_batched(torch.stack([w for _, w, _ in items]), torch.stack([h for _, _, h in items]),
                               scheme.bits, group, scheme.symmetric, scheme.gptq_damping)
        for i, (names, _, _) in enumerate(items):
            row = 0
            for target in names:
                rows = constant(gm, target).shape[0]
                codes[target] = (c[i, row:row + rows].clone(), s[i, row:row + rows].clone(),
                                 z[i, row:row + rows].clone())
                row += rows
    return codes


def rewrite_weight_only(gm: GraphModule, calibration, config: QuantConfig) -> PassContext:
    """AWQ / GPTQ as `config.weight_only.method` says, then the rewrite; gm is changed in place
    (its constants replaced, never modified: ep.module() shares tensors with the user's model)."""
    scheme: WeightOnly = config.weight_only
    ctx = PassContext()
    targets = weight_targets(gm, scheme.embeddings, config.keep_float)
    if scheme.method in ("awq", "awq+gptq") and len(calibration):
        results = scale_activations(gm, calibration, scheme, set(targets))
        ctx.rewrites["AWQ: activation scales folded"] += sum(r.alpha > 0 for r in results)
    clip = scheme.awq_clip and scheme.method in ("awq", "awq+gptq") and len(calibration)
    compensate = scheme.method in ("gptq", "awq+gptq") and len(calibration)
    h = hessians(gm, _linears(targets), calibration) if clip or compensate else {}
    if clip:
        ctx.rewrites["AWQ: weights clipped"] += _clip(gm, targets, h, scheme)
    codes = {}
    if compensate:
        codes = _gptq_codes(gm, targets, h, scheme)
        ctx.rewrites["GPTQ: weights quantized with error compensation"] += len(codes)
    WeightOnlyLinear(scheme.bits, scheme.group_size, scheme.symmetric, scheme.embeddings, codes,
                     config.keep_float, scheme.table_scheme()).run(gm, ctx)
    return ctx
