"""The registry of qlower's ONNX translations: op overload -> translation, and the capability
predicate that says which nodes of that op it translates."""
from __future__ import annotations

from typing import Callable, Optional

from torch.fx import Node

Predicate = Callable[[Node], Optional[str]]
TABLE: dict[object, Callable] = {}          # op overload -> translation
PREDICATES: dict[object, Predicate] = {}    # op overload -> capability predicate (None: always)


def lowers(*targets, when: Predicate | None = None):
    """Register the decorated function as the ONNX translation of `targets`."""
    def register(fn: Callable) -> Callable:
        for target in targets:
            TABLE[target] = fn
            if when is not None:
                PREDICATES[target] = when
        return fn
    return register
