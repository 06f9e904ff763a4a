"""AWQ-style activation-aware scaling (Lin et al. 2024) for weight-only quantization.

A few input channels of a linear carry much larger activations than the rest; their weights
matter more to the output than their share of a group's range says. Multiplying weight input
channel c by s[c] (and dividing the activation by s[c], folded into the op that produces it:
a norm's weight, the gated MLP's up projection — SmoothQuant's folding, smoothquant.py) gives
those channels more of the group's levels. s = mean|X_c|^a, normalized to a geometric mean of
1; the strength a is searched per group of linears sharing the input by the measured output
error ||X W^T - (X/s) Q(W s)^T||^2 on calibration rows, Q the numerics' round-to-nearest
group quantization; a = 0 (no scaling) is a candidate.

Then clipping (AWQ's auto_clip; `WeightOnly.awq_clip`): a group's largest weights set its step,
and rounding every other weight of the group on a coarse step can cost more output error than
clamping the few largest. Per output row and group, the weights are clamped to +-r times the
group's largest magnitude (numerics.clip_weight_groups), r in {1, 0.95, ..., 0.5} chosen by the
group's share of the output error d H_g d^T (d = w - Q(clip_r(w)) over the group's inputs,
H_g = X_g^T X_g the group's block of the calibration inputs' second moment; the cross terms
between groups are left out, as in AWQ); r = 1 (no clipping) is a candidate and wins ties. The
clamped weights replace the float constants; the codes come from them (round to nearest, or
GPTQ).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import GraphModule

from .. import numerics
from .config import WeightOnly
from .smoothquant import collect, find_groups, fold, get_constant

ALPHAS = tuple(i / 10 for i in range(11))   # 0 (no scaling) ... 1
CLIP_RATIOS = tuple(1 - i / 20 for i in range(11))   # 1 (no clipping) ... 0.5
ROWS = 512


@dataclass(frozen=True)
class AwqResult:
    act: str
    alpha: float
    error: float
    error_unscaled: float


def fake_quant(w: torch.Tensor, scheme: WeightOnly) -> torch.Tensor:
    """w through the numerics' round-to-nearest group quantization and back."""
    group = scheme.group_size or w.shape[1]
    scale, zp = numerics.weight_only_qparams(w, scheme.bits, group, scheme.symmetric)
    return numerics.fake_quantize_weight_groups(w, scale, zp, scheme.bits, group)


def channel_scales(mean_abs: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = mean|X|^a over a geometric mean of 1 (channels never active get 1)."""
    s = mean_abs.clamp_min(1e-8).pow(alpha)
    s = s / torch.exp(torch.log(s).mean())
    return torch.where(mean_abs > 0, s, torch.ones_like(s)).clamp(1e-4, 1e4)


def search(x: torch.Tensor, w: torch.Tensor, mean_abs: torch.Tensor, scheme: WeightOnly) -> tuple[float, float, float]:
    """(alpha, error, unscaled error) minimizing the relative output error on rows x."""
    ref = x @ w.T
    norm = ref.pow(2).sum().clamp_min(1e-30)
    best, base = None, None
    for alpha in ALPHAS:
        s = channel_scales(mean_abs, alpha)
        got = (x / s) @ fake_quant(w * s, scheme).T
        err = ((ref - got).pow(2).sum() / norm).item()
        if alpha == 0.0:
            base = err
        if best is None or err < best[1]:
            best = (alpha, err)
    return best[0], best[1], base


def scale_activations(gm: GraphModule, calibration, scheme: WeightOnly, quantized: set[str]) -> list[AwqResult]:
    """Search and fold the scales of every group whose linears are all weight-only quantized
    (`quantized`: their weights' get_attr targets)."""
    groups = [g for g in find_groups(gm) if all(lin.args[1].target in quantized for lin in g.linears)]
    if not groups:
        return []
    rec = collect(gm, groups, calibration, ROWS)
    results = []
    for g in groups:
        x = torch.cat(rec.samples[g.act])
        mean_abs = x.abs().mean(dim=0)
        w = torch.cat([get_constant(gm, lin.args[1].target).detach().float() for lin in g.linears])
        alpha, err, base = search(x, w, mean_abs, scheme)
        if alpha > 0:
            fold(gm, g, channel_scales(mean_abs, alpha))
        results.append(AwqResult(g.act.name, alpha, err, base))
    return results


def clip_ratios(w: torch.Tensor, h: torch.Tensor, scheme: WeightOnly) -> torch.Tensor:
    """The clip ratio [N, G] of each output row and group of weight w [N, K] (module docstring),
    from h [K, K] = X^T X of the linear's calibration inputs."""
    n, k = w.shape
    group = scheme.group_size or k
    groups = numerics.weight_groups(k, group)
    pad = groups * group - k
    # diagonal blocks of H, [G, g, g] (the padded features have zero rows: no error counted)
    blocks = torch.nn.functional.pad(h.to(torch.float64), (0, pad, 0, pad)).reshape(groups, group, groups, group)
    blocks = blocks[torch.arange(groups), :, torch.arange(groups), :]
    w = w.detach().to(torch.float32)
    _, amax = numerics.weight_group_ranges(w, group, symmetric=True)
    best = torch.ones(n, groups, dtype=torch.float32)
    best_error = torch.full((n, groups), float("inf"), dtype=torch.float64)
    for r in CLIP_RATIOS:
        ratio = torch.full((n, groups), r, dtype=torch.float32)
        d = (w - fake_quant(numerics.clip_weight_groups(w, ratio, group, amax), scheme)).to(torch.float64)
        d = torch.nn.functional.pad(d, (0, pad)).reshape(n, groups, group).transpose(0, 1)   # [G, N, g]
        error = ((d @ blocks) * d).sum(-1).T                                                   # [N, G]
        better = error < best_error
        best = torch.where(better, ratio, best)
        best_error = torch.where(better, error, best_error)
    return best
