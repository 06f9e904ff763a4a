"""The registry of per-op lowerings the IREE backend's capability is derived from.

Two kinds, because a cluster is compiled by one of two routes (docs/iree.md says why):
- "tosa": qlower's integer ops (and shape ops on integer tensors), emitted by qlower itself as
  TOSA (+ arith on tensors where TOSA has no exact form, e.g. IEEE division in quantize);
  each has an emit function (tosa_ops.py) and a check that names what it cannot express.
- "torch": float ATen ops, imported by torch's FX importer (shipped with iree-base-compiler)
  into the torch dialect and lowered by IREE; there is no per-op table for these, only one
  check (float tensors, static shapes, no mutation).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.fx import Node

from ...fx import schema_name

Check = Callable[[Node], Optional[str]]   # None: lowerable; else the reason it is not
Emit = Callable[..., object]              # emit(emitter, node, args) -> Val


@dataclass(frozen=True)
class Lowering:
    kind: str                 # "tosa" | "torch"
    check: Check
    emit: Emit | None = None  # tosa lowerings only


TOSA_LOWERINGS: dict[str, Lowering] = {}
INTEGER_DTYPES = (torch.int8, torch.uint8, torch.int32)


def tosa_lowering(*names: str, check: Check | None = None):
    """Register `emit` as the TOSA lowering of op schemas `names` (guarded by `check`)."""
    def register(emit: Emit) -> Emit:
        for name in names:
            TOSA_LOWERINGS[name] = Lowering("tosa", _all_of(static_shapes, check), emit)
        return emit
    return register


def _all_of(*checks: Check | None) -> Check:
    def check(node: Node) -> str | None:
        for c in checks:
            why = c(node) if c is not None else None
            if why is not None:
                return why
        return None
    check.__doc__ = next((c.__doc__ for c in reversed(checks) if c is not None and c.__doc__), None)
    return check


def tensor_vals(node: Node) -> list[torch.Tensor]:
    """The (fake) tensors a node reads and produces, from meta['val']."""
    vals = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    out = []
    for v in vals:
        out += [t for t in (v if isinstance(v, (tuple, list)) else [v]) if isinstance(t, torch.Tensor)]
    return out


def static_shapes(node: Node) -> str | None:
    """static shapes"""
    for t in tensor_vals(node):
        if any(not isinstance(d, int) for d in t.shape):
            return "dynamic shapes are not lowered by the iree backend yet (static shapes only)"
    return None


def integer_input(node: Node) -> str | None:
    """first input is an int8/uint8/int32 tensor"""
    first = node.all_input_nodes[0].meta.get("val") if node.all_input_nodes else None
    if not isinstance(first, torch.Tensor) or first.dtype not in INTEGER_DTYPES:
        return "not an integer tensor (float shape ops go through the torch importer)"
    return None


def kind_of(node: Node) -> str | None:
    """'tosa' or 'torch': the route a supported node takes (None when neither accepts it)."""
    if node.target is operator.getitem:   # an output pick goes where its producer goes
        producer = node.args[0]
        return kind_of(producer) if isinstance(producer, Node) else None
    lowering = TOSA_LOWERINGS.get(schema_name(node))
    if lowering is not None and lowering.check(node) is None:
        return "tosa"
    return "torch" if float_check(node) is None else None


def float_check(node: Node) -> str | None:
    """float ATen op with static shapes, through torch's FX importer"""
    if node.target is operator.getitem:
        producer = node.args[0]
        return None if isinstance(producer, Node) and float_check(producer) is None else "getitem of a non-float op"
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.name.startswith(("aten::", "prims::")):
        return "no IREE lowering (not an ATen op)"
    if schema.is_mutable:
        return "mutates its input (module state stays in PyTorch)"
    vals = tensor_vals(node)
    if any(t.dtype in (torch.int8, torch.uint8) for t in vals):
        return "reads or produces a quantized integer tensor outside qlower's integer ops"
    if not any(t.dtype.is_floating_point for t in vals):
        return "no float tensor: an integer-only ATen op is not lowered"
    pool = _unit_window_ceil_pool(node, schema.name)
    if pool is not None:
        return pool
    return static_shapes(node)


def _unit_window_ceil_pool(node: Node, name: str) -> str | None:
    """max/avg pool with ceil_mode and a 1-wide window at stride 1 (a no-op ceil): torch-mlir's
    linalg lowering computes the wrong output size and iree-compile rejects the module
    ("'linalg.generic' op inferred input/output operand #2 has shape's dimension #2 to be 4,
    but found 3"). Measured on a [1, 2, 5, 9] input over kernel 1-3, stride 1-3, padding
    0..k//2, dilation 1-2, ceil_mode=True: only kernel 1 / stride 1 failed, for both pools
    (tests/test_fuzz.py::test_regression_iree_pool_ceil_mode_unit_window)."""
    from ...fx import full_args
    if name not in ("aten::max_pool2d", "aten::max_pool2d_with_indices", "aten::avg_pool2d"):
        return None
    a = full_args(node)
    ceil = a[5] if name != "aten::avg_pool2d" else a[4]
    if not ceil:
        return None
    kernel = list(a[1]) * (2 // len(a[1]))
    stride = list(a[2] or a[1])
    stride = stride * (2 // len(stride))
    if any(k == 1 and s == 1 for k, s in zip(kernel, stride)):
        return "ceil_mode with a 1-wide window at stride 1 is mis-lowered by torch-mlir (iree-compile rejects it)"
    return None
