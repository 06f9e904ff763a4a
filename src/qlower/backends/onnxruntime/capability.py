"""What the onnxruntime backend accepts, derived — never listed by hand:
- qlower's own ops: the ONNX translation table (lowering/), each with its predicate;
- every other op: whatever torch.onnx's translator (torchlib's registry, or a decomposition
  into registered ops) can translate, minus the engine gaps measured below.
"""
from __future__ import annotations

import functools
import operator
from typing import Callable

import torch
from torch.fx import Node

from ...fx import full_args, target_schema_name
from ...partition import Capability
from .lowering import PREDICATES, translation_table

def _divisor_override(node: Node) -> str | None:
    """with divisor_override"""
    # torchlib 0.7.2 drops divisor_override (measured: avg_pool2d(x, 2, divisor_override=3)
    # came back as the plain mean, off by 0.9 on randn input).
    args = full_args(node)
    return "avg_pool2d with divisor_override is not translated correctly" if args[6] is not None else None


# Measured gaps of the translator or of ONNX Runtime 1.31 (the op translates, but the result
# is wrong or the session rejects it): schema name -> predicate naming the failing variant.
GAPS: dict[str, Callable[[Node], str | None]] = {
    "aten::avg_pool2d": _divisor_override,
}
_SUPPORTED_DTYPES = {torch.float32, torch.uint8, torch.int8, torch.int32, torch.int64, torch.bool}


@functools.lru_cache(maxsize=1)
def _torchlib():
    from .translate import _registry
    return _registry()


@functools.lru_cache(maxsize=1)
def _decomposable() -> frozenset:
    """Ops torch.onnx decomposes before translating (its decomposition table)."""
    from torch.onnx._internal.exporter._decomp import create_onnx_friendly_decomposition_table
    return frozenset(create_onnx_friendly_decomposition_table(set()))


def _composite(target) -> bool:
    """CompositeImplicitAutograd ops (aten.batch_norm, ...) decompose during export."""
    return isinstance(target, torch._ops.OpOverload) and \
        torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd")


def _dtypes_ok(node: Node) -> str | None:
    for v in [node.meta.get("val"), *(a.meta.get("val") for a in node.all_input_nodes)]:
        if isinstance(v, torch.Tensor) and v.dtype not in _SUPPORTED_DTYPES:
            return f"dtype {v.dtype} is not compiled for ONNX Runtime"
    return None


def translatable(node: Node) -> str | None:
    """translated by torch.onnx (torchlib)"""
    target = node.target
    if target is operator.getitem:
        return None
    gap = GAPS.get(target_schema_name(target))
    if gap is not None and gap(node) is not None:
        return gap(node)
    if not (_torchlib().is_registered(target) or target in _decomposable() or _composite(target)):
        return "torch.onnx has no translation for it"
    return _dtypes_ok(node)


def onnxruntime_capability() -> Capability:
    cap = Capability("onnxruntime")
    for target in translation_table():
        cap.register(target_schema_name(target), PREDICATES.get(target))
    cap.register("*", translatable)
    for name, gap in GAPS.items():   # listed by `qlower ops` with the variant they refuse
        cap.register(name, _translatable_except(gap))
    return cap


def _translatable_except(gap) -> Callable[[Node], str | None]:
    def predicate(node: Node) -> str | None:
        return translatable(node)
    what = (gap.__doc__ or gap.__name__.strip("_").replace("_", " ")).strip().splitlines()[0]
    predicate.__doc__ = f"translated by torch.onnx (torchlib), except (a measured gap) {what}"
    return predicate
