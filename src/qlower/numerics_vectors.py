"""Inputs on every edge of the canonical numerics (numerics.py), shared by the per-backend
bit-exactness tests and `qlower device-check` (which runs them on a GPU): int32 accumulators on
every rounding edge, scales on every multiplier/shift edge, float values on every quantize edge."""
from __future__ import annotations

import torch

# scales on the multiplier/shift edges: exact halves (ties), 2^-k, shift > 31, the documented
# single-vs-double-round case, a scale close to the rescale limit, and a mantissa rounding to 2^31
EDGE_SCALES = [0.5, 0.25, 2.0**-25, 0.0050196624, 0.999, 2.0**-40, 0.1, (1 - 2.0**-33) * 0.5]

_ACC_EDGES = [0, 1, -1, 5, -5, 3, -3, 5279, -5279, 2**24 + 1, -(2**24 + 1), 2**31 - 1, -(2**31 - 1), -(2**31),
              2**30, -(2**30), 2**30 - 1, -(2**30) - 1, 1023, 1024, 1025, -1023, -1024, -1025, 127, 128, 129, -129]


def tie_vector(channels: int, limit: int | None = None, small: int = 64, small_range: int = 5000) -> torch.Tensor:
    """int32 accumulators [N, channels] on every rounding edge: exact ties of both signs, ties
    +-1, 2^24 + 1, the int32 extremes (or +-limit), zero; 64 random values over the whole range
    (int32, or [-limit, limit)) and `small` in [-small_range, small_range)."""
    lo, hi = (-(2**31), 2**31) if limit is None else (-limit, limit)
    edges = [e for e in _ACC_EDGES if lo <= e < hi]
    rand = torch.randint(lo, hi, (64,), generator=torch.Generator().manual_seed(0))
    near = torch.randint(-small_range, small_range, (small,), generator=torch.Generator().manual_seed(1))
    vals = torch.cat([torch.tensor(edges, dtype=torch.int64), rand, near]).to(torch.int32)
    return vals[:, None].expand(-1, channels).contiguous()


def quantize_edges(scale: float) -> torch.Tensor:
    """float32 inputs on every quantize edge for `scale`: the IEEE-division case (not a
    reciprocal), ties to even of both signs, +-inf, NaN, values past both ends, signed zeros,
    600 exact ties and 500 random values."""
    edges = torch.tensor([0.273939937, 2.5, 0.5, -0.5, 1.5, 3.5, float("inf"), float("-inf"), float("nan"),
                          1e9, -1e9, 0.0, -0.0], dtype=torch.float32)
    rand = torch.randn(500, generator=torch.Generator().manual_seed(0)) * 3 * scale * 100
    ties = (torch.arange(-300, 300, dtype=torch.float32) + 0.5) * scale
    return torch.cat([edges, rand, ties])


class QuantizeDequantize(torch.nn.Module):
    """q = qlower.quantize(x), and its dequantize: the module the quantize edges run through."""

    def __init__(self, scale: float, zp: int, dtype: torch.dtype):
        super().__init__()
        self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32))
        self.register_buffer("zp", torch.tensor(zp, dtype=torch.int32))
        self.dtype = dtype

    def forward(self, x):
        qmin, qmax = (0, 255) if self.dtype == torch.uint8 else (-128, 127)
        q = torch.ops.qlower.quantize(x, self.scale, self.zp, qmin, qmax, self.dtype, None)
        return q, torch.ops.qlower.dequantize(q, self.scale, self.zp, None)
