"""Built-in models, defined in code with seeded random weights (no downloads). Used by
`qlower demo`, `qlower bench` and the tests."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .models import ResNetish, TinyEncoder


@dataclass(frozen=True)
class ZooEntry:
    name: str
    build: Callable[[], torch.nn.Module]
    example: Callable[[int], tuple]            # batch -> example input tuple
    description: str

    def model(self) -> torch.nn.Module:
        torch.manual_seed(0)
        return self.build().eval()

    def inputs(self, batch: int = 1, seed: int = 1) -> tuple:
        gen = torch.Generator().manual_seed(seed)
        return tuple(t.normal_(generator=gen) if t.dtype.is_floating_point else t
                     for t in self.example(batch))

    def calibration(self, batches: int = 8, batch: int = 1) -> list[tuple]:
        return [self.inputs(batch, seed=100 + i) for i in range(batches)]


ZOO: dict[str, ZooEntry] = {
    "cnn": ZooEntry("cnn", lambda: ResNetish(), lambda b: (torch.empty(b, 3, 32, 32),),
                    "ResNet-style CNN: conv-BN-ReLU stem, 3 residual stages, max/avg pool, FC"),
    "transformer": ZooEntry("transformer", lambda: TinyEncoder(),
                            lambda b: (torch.empty(b, 16, 64),),
                            "2-layer transformer encoder: MHA (matmul/softmax), LayerNorm, GELU MLP"),
}


def get(name: str) -> ZooEntry:
    from ..errors import QlowerError
    if name not in ZOO:
        raise QlowerError(f"unknown zoo model {name!r}", hint=f"choose from {sorted(ZOO)}")
    return ZOO[name]
