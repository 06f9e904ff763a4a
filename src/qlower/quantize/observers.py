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


class MSEObserver(MinMaxObserver):
    """Picks the clipping range [lo, hi] that minimizes the measured quantization MSE of the
    calibration values themselves (not a fixed percentile): with a few outliers 100x the bulk,
    clipping them costs less squared error than the rounding error that their range spreads
    over every other value; without outliers the search keeps the min/max range.

    Memory is bounded: per batch the `top` largest |x| are kept exactly (weight 1), plus a
    seeded uniform sample of the rest weighted by the fraction it stands for. The search
    shrinks both ends together over a geometric grid, then each end alone (coordinate steps),
    scoring each candidate with qlower's rounding (round half to even, clamp)."""

    def __init__(self, *args, samples: int = 4096, top: int = 256, **kwargs):
        super().__init__(*args, **kwargs)
        self.samples, self.top = samples, top
        self._values: list[torch.Tensor] = []
        self._weights: list[torch.Tensor] = []
        self._gen = torch.Generator().manual_seed(0)
        self._searched = False

    def forward(self, x_orig):
        if x_orig.numel() == 0:
            return x_orig
        super().forward(x_orig)
        x = x_orig.detach().reshape(-1).to(torch.float32)
        values, weights = _weighted_sample(x, self.top, self.samples, self._gen)
        self._values.append(values)
        self._weights.append(weights)
        self._searched = False
        return x_orig

    def calculate_qparams(self):
        if self._values and not self._searched:
            lo, hi = mse_range(torch.cat(self._values), torch.cat(self._weights),
                               float(self.min_val), float(self.max_val), self.quant_min, self.quant_max,
                               symmetric=self.qscheme in (torch.per_tensor_symmetric, torch.per_channel_symmetric))
            self.min_val.fill_(lo)
            self.max_val.fill_(hi)
            self._searched = True
        return super().calculate_qparams()


def _weighted_sample(x: torch.Tensor, top: int, samples: int, gen: torch.Generator):
    """The `top` largest |x| (weight 1) and `samples` uniform draws of the rest (weight n/samples)."""
    if x.numel() <= top + samples:
        return x.clone(), torch.ones_like(x)
    keep = torch.ones_like(x, dtype=torch.bool)
    idx = x.abs().topk(top).indices
    keep[idx] = False
    head, rest = x[idx], x[keep]
    pick = torch.randint(0, rest.numel(), (samples,), generator=gen)
    weights = torch.cat([torch.ones(top), torch.full((samples,), rest.numel() / samples)])
    return torch.cat([head, rest[pick]]), weights


def _sse(values, weights, lo, hi, qmin, qmax, symmetric: bool) -> torch.Tensor:
    """Weighted squared quantization error of `values` for each candidate range (lo[i], hi[i])."""
    if symmetric:
        scale = (torch.maximum(-lo, hi) / ((qmax - qmin) / 2)).clamp_min(2**-12)
        zp = torch.zeros_like(scale)
    else:
        scale = ((hi - lo) / (qmax - qmin)).clamp_min(2**-12)
        zp = torch.clamp(torch.round(qmin - lo / scale), qmin, qmax)
    v = values[None, :]
    q = torch.clamp(torch.round(v / scale[:, None]) + zp[:, None], qmin, qmax)
    err = ((q - zp[:, None]) * scale[:, None] - v).pow(2)
    return (err * weights[None, :]).sum(dim=1)


def mse_range(values: torch.Tensor, weights: torch.Tensor, lo: float, hi: float, qmin: int, qmax: int,
              symmetric: bool = False, steps: int = 32, ratio: float = 0.85) -> tuple[float, float]:
    """(lo, hi) minimizing the weighted quantization SSE: both ends shrunk together over
    `ratio`^k, then (asymmetric) hi alone and lo alone, then both again in 2% steps, each
    within the observed min/max."""
    lo0, hi0 = min(lo, 0.0), max(hi, 0.0)
    grid = ratio ** torch.arange(steps, dtype=torch.float32)

    def best(los, his):
        sse = _sse(values, weights, los, his, qmin, qmax, symmetric)
        i = int(sse.argmin())
        return float(los[i]), float(his[i])

    lo, hi = best(lo0 * grid, hi0 * grid)
    if symmetric:
        return lo, hi
    lo, hi = best(torch.full_like(grid, lo), _around(hi, hi0, grid))
    lo, hi = best(_around(lo, lo0, grid), torch.full_like(grid, hi))
    fine = 0.98 ** torch.arange(-8, 9, dtype=torch.float32)   # 2% steps, +-15%
    lo, hi = best(torch.full_like(fine, lo), _clamp(hi * fine, hi0))
    return best(_clamp(lo * fine, lo0), torch.full_like(fine, hi))


def _clamp(candidates: torch.Tensor, bound: float) -> torch.Tensor:
    return candidates.clamp(max=bound) if bound >= 0 else candidates.clamp(min=bound)


def _around(value: float, bound: float, grid: torch.Tensor) -> torch.Tensor:
    """Candidates from value/ratio^8 (capped at the observed bound) down to value*ratio^(steps-9):
    a coordinate step may also widen an end the joint shrink cut too far."""
    return _clamp(value * grid / grid[8], bound)


def pin_qparams(observer, scale: float, zero_point: int) -> None:
    """Make a calibrated observer report (scale, zero_point) to convert_pt2e. The observer
    instance is shared by every edge that shares these qparams, so all of them follow, as does
    everything derived from them (a following layer's bias scale)."""
    pinned = (torch.tensor([scale], dtype=torch.float32), torch.tensor([zero_point], dtype=torch.int32))
    observer.calculate_qparams = lambda: pinned
