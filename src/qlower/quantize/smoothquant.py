"""SmoothQuant (Xiao et al. 2023) on the captured float graph, before annotation.

Real transformer activations have a few channels 10-100x larger than the rest (SmolLM2-135M:
the MLP down-projection input reaches 30 where the median channel peaks at 0.25), so one
per-tensor activation scale spends almost all of int8's levels on them. SmoothQuant divides
activation channel c by s[c] and multiplies the following weights' input channel c by s[c]:
the product is unchanged, the activation loses its outliers, the per-channel weights absorb
them. The division is folded into the op that produces the activation, so the runtime graph
is unchanged (only constants change):
- a norm's weight (LLaMA RMSNorm `weight * x`, `aten.layer_norm`, qlower's rms/layer_norm
  block ops): weight[c] / s[c] (and a layer norm's bias);
- a gated MLP's `act(gate) * up`: up's output row c (and bias) / s[c].
s[c] = max|X_c|^a / max|W_c|^(1-a); the strength `a` is searched per group of linears sharing
the input, by the measured error of their quantized outputs on calibration batches held out
from those the scales and ranges come from (`Split`); no smoothing is a candidate too.
Numbers: docs/accuracy.md.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node

from .. import numerics
from ..capture import check_example_inputs
from .config import SmoothQuant

aten = torch.ops.aten
_q = torch.ops.qlower


@dataclass
class Group:
    """Linears sharing one input `act`, and the constants that absorb 1/s (scaled along
    `fold_axes`: 0 for a norm's weight/bias vector, 0 (output rows) for a linear's weight)."""
    act: Node
    linears: list[Node]
    fold: list[str]          # get_attr targets divided by s along dim 0


@dataclass(frozen=True)
class GroupResult:
    act: str
    alpha: float | None      # None: left unsmoothed
    error: float             # relative output error of the chosen scaling
    error_unsmoothed: float


def find_groups(gm: GraphModule) -> list[Group]:
    """Every activation that feeds only linears (with constant weights used nowhere else) and
    is produced by a foldable op."""
    uses = _attr_uses(gm)
    groups = []
    for node in gm.graph.nodes:
        linears = list(node.users)
        if not linears or not all(_smoothable_linear(u, node, uses) for u in linears):
            continue
        fold = _fold_targets(node, uses)
        if fold:
            groups.append(Group(node, linears, fold))
    return groups


def _attr_uses(gm: GraphModule) -> dict[str, int]:
    """How many nodes use each get_attr target (tied weights count every use)."""
    counts: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            counts[node.target] = counts.get(node.target, 0) + len(node.users)
    return counts


def _const(arg, uses: dict[str, int]) -> str | None:
    """The get_attr target of `arg` when it is a float constant used only once."""
    if isinstance(arg, Node) and arg.op == "get_attr" and uses.get(arg.target) == 1:
        return arg.target
    return None


def _smoothable_linear(user: Node, act: Node, uses: dict[str, int]) -> bool:
    if user.op != "call_function" or user.target is not aten.linear.default or user.args[0] is not act:
        return False
    return _const(user.args[1], uses) is not None


def _fold_targets(node: Node, uses: dict[str, int]) -> list[str]:
    """Constants that divide `node`'s output channels when divided by s along dim 0."""
    if node.op != "call_function":
        return []
    channels = node.meta["val"].shape[-1] if hasattr(node.meta.get("val"), "shape") else None
    if node.target is aten.mul.Tensor:
        return _fold_mul(node, uses, channels)
    norm_args = {aten.layer_norm.default: (2, 3), _q.layer_norm.default: (2, 3), _q.rms_norm.default: (2,)}
    if node.target in norm_args:
        targets = [_const(node.args[i], uses) if i < len(node.args) else None for i in norm_args[node.target]]
        if targets[0] is None or len(node.args[1]) != 1:
            return []
        return [t for t in targets if t is not None]
    return []


def _fold_mul(node: Node, uses: dict[str, int], channels) -> list[str]:
    a, b = node.args[:2]
    for weight, other in ((a, b), (b, a)):
        target = _const(weight, uses)
        if target is not None and tuple(weight.meta["val"].shape) == (channels,):
            return [target]  # RMSNorm: weight * normalized
    for lin, other in ((a, b), (b, a)):  # gated MLP: act(gate) * up(x)
        if isinstance(lin, Node) and lin.op == "call_function" and lin.target is aten.linear.default \
                and len(lin.users) == 1 and isinstance(other, Node) \
                and tuple(other.meta["val"].shape) == tuple(lin.meta["val"].shape):
            w = _const(lin.args[1], uses)
            bias = lin.args[2] if len(lin.args) > 2 else None
            b_target = _const(bias, uses) if bias is not None else None
            if w is not None and (bias is None or b_target is not None):
                return [w] + ([b_target] if b_target else [])
    return []


# ---------------------------------------------------------------- statistics
class _Recorder(torch.fx.Interpreter):
    """Runs the float graph, keeping per batch each group input's per-channel |max| and rows
    (at most `rows` per group in all)."""

    def __init__(self, gm: GraphModule, acts: list[Node], rows: int):
        super().__init__(gm)
        self.acts = set(acts)
        self.rows = rows
        self.absmax: dict[Node, list[torch.Tensor]] = {a: [] for a in acts}
        self.samples: dict[Node, list[torch.Tensor]] = {a: [] for a in acts}

    def run_node(self, n: Node):
        out = super().run_node(n)
        if n in self.acts:
            x = out.detach().reshape(-1, out.shape[-1]).float()
            self.absmax[n].append(x.abs().amax(dim=0))
            per_batch = max(1, self.rows // 8)
            self.samples[n].append(x[:: max(1, x.shape[0] // per_batch)][:per_batch].clone())
        return out


def collect(gm: GraphModule, groups: list[Group], calibration: Iterable, rows: int) -> _Recorder:
    rec = _Recorder(gm, [g.act for g in groups], rows)
    with torch.no_grad():
        for batch in calibration:
            rec.run(*check_example_inputs(batch))
    return rec


# ---------------------------------------------------------------- search
def fake_quant_activation(x: torch.Tensor, unsigned: bool = True, fit: torch.Tensor | None = None) -> torch.Tensor:
    """Per-tensor min/max activation quantization with qlower's numerics (uint8 asymmetric or
    int8 symmetric), the range taken from `fit` (default x), as a calibrated program applies it."""
    dtype = torch.uint8 if unsigned else torch.int8
    qmin, qmax = numerics.dtype_range(dtype)
    fit = x if fit is None else fit
    lo, hi = min(fit.min().item(), 0.0), max(fit.max().item(), 0.0)
    if unsigned:
        scale = max((hi - lo) / (qmax - qmin), 2**-12)
        zp = int(round(qmin - lo / scale))
    else:
        scale, zp = max(max(-lo, hi) / ((qmax - qmin) / 2), 2**-12), 0
    return (torch.clamp(torch.round(x / scale) + zp, qmin, qmax) - zp) * scale


def fake_quant_weight(w: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Per-output-channel symmetric weight quantization in [-(2^(b-1)-1), 2^(b-1)-1]."""
    bound = (1 << (bits - 1)) - 1
    scale = (w.abs().amax(dim=1, keepdim=True) / bound).clamp_min(2**-12)
    return torch.clamp(torch.round(w / scale), -bound, bound) * scale


def scales_for(act_absmax: torch.Tensor, weight_absmax: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = max|X|^a / max|W|^(1-a), per input channel; channels that are all zero get 1."""
    s = act_absmax.clamp_min(1e-5).pow(alpha) / weight_absmax.clamp_min(1e-5).pow(1.0 - alpha)
    return torch.where((act_absmax > 0) & (weight_absmax > 0), s, torch.ones_like(s)).clamp(1e-4, 1e4)


def output_error(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor | None, bits: int, unsigned: bool,
                 ref: torch.Tensor | None = None, fit: torch.Tensor | None = None) -> float:
    """||X W^T - Q(X/s) Q(W s)^T||^2 / ||X W^T||^2, the activation range from `fit` rows
    (default X itself); `ref`: X W^T when already computed."""
    ref = x @ w.T if ref is None else ref
    fit = x if fit is None else fit
    xs, ws, fs = (x, w, fit) if s is None else (x / s, w * s, fit / s)
    got = fake_quant_activation(xs, unsigned, fs) @ fake_quant_weight(ws, bits).T
    return ((ref - got).pow(2).sum() / ref.pow(2).sum().clamp_min(1e-30)).item()


@dataclass(frozen=True)
class Split:
    """Calibration rows split by batch: scales and ranges come from `fit`, the error is measured
    on `held_out`. Without that, a channel small in the sampled rows gets a small s, and a
    larger value in new data is clipped hard (random-weight hf-llama: 33.2 -> 29.1 dB when the
    error was measured on the rows the scales came from)."""
    fit: torch.Tensor
    fit_absmax: torch.Tensor
    held_out: torch.Tensor

    @staticmethod
    def of(samples: list[torch.Tensor], absmax: list[torch.Tensor]) -> "Split":
        if len(samples) < 2:
            return Split(samples[0], absmax[0], samples[0])
        return Split(torch.cat(samples[0::2]), torch.stack(absmax[0::2]).amax(dim=0), torch.cat(samples[1::2]))


def search(split: Split, w: torch.Tensor, options: SmoothQuant, bits: int = 8,
           unsigned: bool = True) -> tuple[float | None, float, float]:
    """(alpha, error, unsmoothed error): the strength whose quantized outputs on the held-out
    rows are closest to the float outputs; alpha None when not smoothing is best."""
    x = split.held_out
    ref = x @ w.T
    base = output_error(x, w, None, bits, unsigned, ref, split.fit)
    best: tuple[float | None, float] = (None, base)
    w_absmax = w.abs().amax(dim=0)
    for alpha in options.alphas:
        s = scales_for(split.fit_absmax, w_absmax, alpha)
        err = output_error(x, w, s, bits, unsigned, ref, split.fit)
        if err < best[1]:
            best = (alpha, err)
    return best[0], best[1], base


# ---------------------------------------------------------------- fold
def get_constant(gm: GraphModule, target: str) -> torch.Tensor:
    *path, name = target.split(".")
    return getattr(gm.get_submodule(".".join(path)), name)


def set_constant(gm: GraphModule, target: str, value: torch.Tensor) -> None:
    """Replace (never modify in place: ep.module() shares tensors with the user's model)."""
    *path, name = target.split(".")
    owner = gm.get_submodule(".".join(path))
    if name in owner._parameters:
        owner._parameters[name] = torch.nn.Parameter(value, requires_grad=False)
    elif name in owner._buffers:
        owner._buffers[name] = value
    else:
        setattr(owner, name, value)


def _scale_rows(gm: GraphModule, target: str, factor: torch.Tensor) -> None:
    t = get_constant(gm, target)
    shape = (-1,) + (1,) * (t.dim() - 1)
    set_constant(gm, target, (t.detach().double() * factor.double().reshape(shape)).to(t.dtype))


def fold(gm: GraphModule, group: Group, s: torch.Tensor) -> None:
    """X/s into the producer's constants, W*s into every linear's input channels."""
    for target in group.fold:
        _scale_rows(gm, target, 1.0 / s)
    for lin in group.linears:
        target = lin.args[1].target
        w = get_constant(gm, target)
        set_constant(gm, target, (w.detach().double() * s.double()[None, :]).to(w.dtype))


def smooth(gm: GraphModule, calibration, options: SmoothQuant, bits: int = 8,
           unsigned: bool = True) -> list[GroupResult]:
    """Find the groups, measure, fold the best scaling of each into gm's constants."""
    groups = find_groups(gm)
    if not groups:
        return []
    rec = collect(gm, groups, calibration, options.rows)
    results = []
    for g in groups:
        w = torch.cat([get_constant(gm, lin.args[1].target).detach().float() for lin in g.linears])
        alpha, err, base = search(Split.of(rec.samples[g.act], rec.absmax[g.act]), w, options, bits, unsigned)
        if alpha is not None:  # the folded scales use every batch's maxima
            fold(gm, g, scales_for(torch.stack(rec.absmax[g.act]).amax(dim=0), w.abs().amax(dim=0), alpha))
        results.append(GroupResult(g.act.name, alpha, err, base))
    return results


__all__ = ["SmoothQuant", "GroupResult", "smooth", "find_groups", "search", "scales_for", "output_error",
           "fake_quant_activation", "fake_quant_weight"]
