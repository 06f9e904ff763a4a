"""One built-in model: how to build it and make its inputs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class ZooEntry:
    name: str
    build: Callable[[], torch.nn.Module]
    example: Callable[[int], tuple]            # batch -> example input tuple
    description: str
    dynamic: Callable[[], object] | None = None  # dynamic_shapes for torch.export, where it matters

    def model(self) -> torch.nn.Module:
        torch.manual_seed(0)
        return self.build().eval()

    def inputs(self, batch: int = 1, seed: int = 1) -> tuple:
        """Example inputs: float tensors are N(0, 1); integer tensors are filled by the entry
        (token ids, masks) from the same seed."""
        gen = torch.Generator().manual_seed(seed)
        tensors = self.example(batch, gen) if _takes_gen(self.example) else self.example(batch)
        return tuple(t.normal_(generator=gen) if t.dtype.is_floating_point else t for t in tensors)

    def calibration(self, batches: int = 8, batch: int = 1) -> list[tuple]:
        return [self.inputs(batch, seed=100 + i) for i in range(batches)]


def _takes_gen(fn) -> bool:
    return "gen" in fn.__code__.co_varnames[:fn.__code__.co_argcount]
