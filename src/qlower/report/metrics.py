"""Accuracy metrics between a reference (fp32) output and a test output."""
from __future__ import annotations

import math

import torch


def _flat(outputs) -> torch.Tensor:
    leaves = torch.utils._pytree.tree_leaves(outputs)
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in leaves if isinstance(t, torch.Tensor)])


def sqnr_db(reference, test) -> float:
    """Signal-to-quantization-noise ratio in dB (inf when identical)."""
    r, t = _flat(reference), _flat(test)
    noise = (r - t).pow(2).sum().item()
    signal = r.pow(2).sum().item()
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
