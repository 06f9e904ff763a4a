"""qlower's own ONNX translations: one function per qlower op, registered in TABLE, handed to
torch.onnx as its `custom_translation_table`. Everything else (every ATen op) is translated by
torch.onnx / onnxscript's torchlib; qlower keeps no ATen -> ONNX table of its own.

A translation is an onnxscript *traced* function: it receives the op's tensor operands as ONNX
values (constants carry `const_value`) and its scalar arguments as Python values (the signature's
annotations say which is which), and calls onnxscript ops. `lowers(target, when=...)` registers
one, with the capability predicate that says which nodes of that op it can translate; the
backend's capability is derived from this table and torchlib's registry (capability.py).
"""
from __future__ import annotations

from typing import Callable

from . import blockops, integer, weight_only  # noqa: F401  (modules register on import)
from .table import PREDICATES, TABLE, Predicate, lowers

__all__ = ["PREDICATES", "TABLE", "Predicate", "lowers", "translation_table"]


def translation_table() -> dict[object, Callable]:
    return dict(TABLE)
