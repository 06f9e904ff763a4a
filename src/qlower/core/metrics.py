"""Accuracy metrics between a reference (fp32) output and a test output."""
from __future__ import annotations

import math

import torch


def _flat(outputs) -> torch.Tensor:
    leaves = torch.utils._pytree.tree_leaves(outputs)
    if not any(isinstance(t, torch.Tensor) for t in leaves):   # only Python numbers: nothing to compare
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in leaves if isinstance(t, torch.Tensor)])


def sqnr_db(reference, test) -> float:
    """Signal-to-quantization-noise ratio in dB (inf when identical)."""
    r, t = _flat(reference), _flat(test)
    return energy_ratio_db(r.pow(2).sum().item(), (r - t).pow(2).sum().item())


def energy_ratio_db(signal: float, noise: float) -> float:
    """10 log10(signal / noise): inf without noise, -inf without signal (the one SQNR formula)."""
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def cosine(reference, test) -> float:
    r, t = _flat(reference), _flat(test)
    denom = r.norm().item() * t.norm().item()
    return float((r @ t).item() / denom) if denom > 0 else (1.0 if torch.equal(r, t) else 0.0)


def max_abs(reference, test) -> float:
    r, t = _flat(reference), _flat(test)
    return float((r - t).abs().max().item()) if r.numel() else 0.0


def format_db(value: float) -> str:
    """A dB figure for tables and reports: two decimals, "inf" for identical outputs."""
    return "inf" if math.isinf(value) and value > 0 else f"{value:.2f}"


def format_number(value: float) -> str:
    """A statistic for tables and reports: 3 significant digits, scientific outside [1e-3, 1e4)."""
    if math.isinf(value):
        return "inf"
    if value == 0:
        return "0"
    return f"{value:.3g}" if 1e-3 <= abs(value) < 1e4 else f"{value:.2e}"
