"""Typed metadata qlower attaches to FX nodes, and the documented `node.meta` keys.

Keys (all under the `qlower.` prefix so they never collide with torch's own):
- `qlower.qparams`  -> `QParams` of the integer tensor a node produces (Q nodes, integer ops)
                       or consumes (DQ nodes: the qparams of their integer input).
- `qlower.refusal`  -> `Refusal`: why a pass left this node in float.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

QPARAMS_KEY = "qlower.qparams"
REFUSAL_KEY = "qlower.refusal"


@dataclass(frozen=True)
class QParams:
    """Quantization parameters of one integer tensor. `scale`/`zero_point` hold one value per
    tensor (axis None) or one per channel along `axis`."""
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    qmin: int
    qmax: int
    dtype: torch.dtype
    axis: int | None = None

    def __post_init__(self):
        if len(self.scale) != len(self.zero_point):
            raise ValueError("scale and zero_point must have the same length")
        if self.axis is None and len(self.scale) != 1:
            raise ValueError("per-tensor QParams hold exactly one scale")
        if self.qmin > self.qmax:
            raise ValueError(f"qmin {self.qmin} > qmax {self.qmax}")

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    def scale_tensor(self) -> torch.Tensor:
        return torch.tensor(self.scale, dtype=torch.float32)

    def zero_point_tensor(self) -> torch.Tensor:
        return torch.tensor(self.zero_point, dtype=torch.int32)

    def check_shape(self, shape) -> str | None:
        """Why these qparams cannot describe a tensor of `shape`, or None when they can."""
        if self.axis is None:
            return None
        rank = len(shape)
        if not -rank <= self.axis < rank:
            return f"axis {self.axis} out of range for rank {rank}"
        dim = shape[self.axis]
        if isinstance(dim, int) and dim != len(self.scale):
            return f"{len(self.scale)} scales for channel dim of size {dim} (axis {self.axis})"
        return None


@dataclass(frozen=True)
class Refusal:
    """A recorded decision not to rewrite a node: which pass, which node, and why."""
    pass_name: str
    node: str
    reason: str

    def __str__(self) -> str:
        return f"{self.pass_name}: {self.node}: {self.reason}"
