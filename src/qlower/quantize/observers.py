"""Observers qlower adds to torchao's: a percentile (outlier-clipping) activation observer."""
from __future__ import annotations

import torch
from torchao.quantization.pt2e import MinMaxObserver

_MAX_SAMPLES = 1 << 20


class PercentileObserver(MinMaxObserver):
    """Tracks the running min/max of each batch's [100-p, p] percentiles instead of the raw
    extremes, so a few outliers do not stretch the scale."""

    def __init__(self, *args, percentile: float = 99.99, **kwargs):
        super().__init__(*args, **kwargs)
        self.percentile = percentile

    def forward(self, x_orig):
        if x_orig.numel() == 0:
            return x_orig
        x = x_orig.detach().reshape(-1).to(self.min_val.dtype)
        if x.numel() > _MAX_SAMPLES:  # deterministic stride subsample keeps quantile cheap
            x = x[:: x.numel() // _MAX_SAMPLES + 1]
        q = torch.tensor([1.0 - self.percentile / 100.0, self.percentile / 100.0], dtype=x.dtype)
        lo, hi = torch.quantile(x, q)
        self.min_val.copy_(torch.minimum(lo, self.min_val))
        self.max_val.copy_(torch.maximum(hi, self.max_val))
        return x_orig
