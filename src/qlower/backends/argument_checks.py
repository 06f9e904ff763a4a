"""Index bounds and integer divisors that eager PyTorch checks and an engine does not.

Eager raises for an embedding index out of range (`IndexError`), a gather or scatter index out
of range, and an integer floor division, remainder or truncating division by zero. OpenVINO's
CPU plugin and IREE compute something instead (measured, openvino 2026.4.1 and IREE 3.13: a
10-row embedding read with 12 or -1 returned a row or zeros; `a // 0` returned -2147483647 on
OpenVINO and -9223372036854775807 on IREE): a number where eager has none.

Two ways to keep eager's answer, chosen per node:
- The index (or divisor) is a graph input, or a constant, moved by data movement only (view,
  slice, expand, a cast between wide integer types...): the engine keeps the op. A constant is
  checked once at compile time; an input is checked on the host on each call (`ArgumentCheck`,
  a min and max, or an `all()`, per checked argument: a few microseconds for token ids),
  and a call that fails the check runs in PyTorch, which raises eager's error. This keeps a
  transformer's token embedding, the common case, inside its cluster at that cost.
- Anything else (an index computed inside the program, e.g. `ids + 3`, a size the shape
  environment does not bound): the capability refuses the node (`checkable`), so that op runs
  in PyTorch and raises there. Such indices are rare in models (a pooling's gather of computed
  positions); a host check of a computed value would need the engine to return it.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.fx import GraphModule, Node

from ..fx import constant_value, schema_name
from ..passes.iree.unsafe_index_as_index import UNCHECKED_INDEX

# schema name -> (index argument, dim argument or None, whether negative indices wrap as in Python):
# the bound is the size of the indexed operand (argument 0) along that dim (embedding: its rows)
_INDEXING = {
    "aten::embedding": (1, None, False),
    "aten::index_select": (2, 1, False),
    "aten::gather": (2, 1, False),
    "aten::scatter.src": (2, 1, False),
    "aten::scatter.value": (2, 1, False),
    "aten::scatter_add": (2, 1, False),
    "aten::scatter_reduce.two": (2, 1, False),
    "aten::index_add": (2, 1, False),
    "aten::index_copy": (2, 1, False),
    "aten::index_fill.int_Scalar": (2, 1, True),
    "aten::index_fill.int_Tensor": (2, 1, True),
}
# an index list: one optional index per leading dim of argument 0; Python semantics (negatives wrap)
_INDEX_LISTS = ("aten::index.Tensor", "aten::index_put", "aten::index_put_", "aten::_index_put_impl")
# integer division: the divisor's argument position (a result of a floating dtype never raises)
_DIVIDING = {"aten::floor_divide": 1, "aten::div.Tensor_mode": 1, "aten::div.Scalar_mode": 1,
             "aten::remainder.Tensor": 1, "aten::remainder.Scalar": 1, "aten::remainder.Scalar_Tensor": 1,
             "aten::fmod.Tensor": 1, "aten::fmod.Scalar": 1, "aten::floor_divide.Scalar": 1}
CHECKED_OPS = tuple(_INDEXING) + _INDEX_LISTS + tuple(_DIVIDING)

# ops whose output values are values of their first argument (so the argument's range bounds them)
_MOVING = frozenset(f"aten::{n}" for n in (
    "view", "_unsafe_view", "reshape", "expand", "expand_as", "permute", "transpose.int", "t", "squeeze",
    "squeeze.dim", "squeeze.dims", "unsqueeze", "slice.Tensor", "select.int", "clone", "contiguous", "alias",
    "flatten.using_ints", "unflatten", "narrow", "repeat", "flip", "detach", "lift_fresh_copy", "movedim.int"))
_CASTS = frozenset({"aten::_to_copy", "aten::to.dtype", "aten::to.dtype_layout", "aten::type_as"})
_WIDE_INTEGERS = (torch.int32, torch.int64)


def _val(x):
    return x.meta.get("val") if isinstance(x, Node) else None


def _root(x: Node) -> Node:
    """The node whose values `x`'s values are a selection of (through data movement and casts
    between wide integer types); `x` itself if none."""
    while isinstance(x, Node) and x.op == "call_function" and x.args and isinstance(x.args[0], Node):
        name = schema_name(x)
        src = x.args[0]
        if name in _MOVING or (name in _CASTS and getattr(_val(x), "dtype", None) in _WIDE_INTEGERS
                                and getattr(_val(src), "dtype", None) in _WIDE_INTEGERS):
            x = src
            continue
        break
    return x


def _static(d) -> int | None:
    return d if isinstance(d, int) else None


def requirements(node: Node) -> list[tuple[Node | int | float, str, int, int]] | None:
    """What `node` requires of its operands: (operand, kind, lo, hi) with kind "index" (every
    value in [lo, hi)) or "nonzero"; [] for a node that checks nothing; None when a bound is
    not static (a dynamic indexed size)."""
    if node.op != "call_function" or node.meta.get(UNCHECKED_INDEX):
        return []
    name = schema_name(node)
    if name in _DIVIDING:
        out = _val(node)
        if not isinstance(out, torch.Tensor) or out.dtype.is_floating_point or out.dtype.is_complex:
            return []
        if name.startswith("aten::div") and node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2
                                                             else None) is None:
            return []
        divisor = node.args[_DIVIDING[name]] if len(node.args) > _DIVIDING[name] else None
        return [(divisor, "nonzero", 0, 0)]
    if name in _INDEXING:
        index_pos, dim_pos, wraps = _INDEXING[name]
        src = _val(node.args[0])
        if not isinstance(src, torch.Tensor) or len(node.args) <= index_pos:
            return []
        dim = 0 if dim_pos is None else node.args[dim_pos]
        if not isinstance(dim, int):
            return None
        size = _static(src.shape[dim]) if src.dim() else 1
        if size is None:
            return None
        return [(node.args[index_pos], "index", -size if wraps else 0, size)]
    if name in _INDEX_LISTS:
        src = _val(node.args[0])
        if not isinstance(src, torch.Tensor) or len(node.args) < 2:
            return []
        out = []
        for dim, index in enumerate(node.args[1]):
            if index is None or dim >= src.dim():
                continue
            if getattr(_val(index), "dtype", None) in (torch.bool, torch.uint8):
                return []   # a mask: its shape, not its values, decides (checked when traced)
            size = _static(src.shape[dim])
            if size is None:
                return None
            out.append((index, "index", -size, size))
        return out
    return []


def _holds(value, kind: str, lo: int, hi: int) -> bool:
    """Whether a tensor or Python number meets the requirement."""
    if isinstance(value, torch.Tensor):
        # numpy's reductions: measured ~15% cheaper than torch.aminmax + two int() for 16 token
        # ids, and `all()` (every divisor nonzero) cheaper than `(x == 0).any()`, no mask made
        a = value.detach().numpy()
        if kind == "nonzero":
            return bool(a.all())
        if a.size == 0:
            return True
        return lo <= np.minimum.reduce(a, axis=None) and np.maximum.reduce(a, axis=None) < hi
    if kind == "nonzero":
        return value != 0
    return lo <= value < hi


def checkable(node: Node) -> str | None:
    """an index / integer divisor that is an input or a constant

    None when every index or divisor `node` reads is a graph input (checked on each call) or a
    constant that holds (checked now) through data movement; else why the op stays in
    PyTorch, where a bad value raises as in eager."""
    needs = requirements(node)
    if needs is None:
        return "an index into a dynamic size is not checked before the engine runs (eager raises out of range)"
    gm = node.graph.owning_module
    for operand, kind, lo, hi in needs:
        what = "divisor" if kind == "nonzero" else "index"
        if not isinstance(operand, Node):
            if isinstance(operand, (int, float)) and not _holds(operand, kind, lo, hi):
                return f"a constant {what} eager refuses ({operand})"
            continue
        root = _root(operand)
        if root.op == "placeholder":
            continue
        value = constant_value(gm, root) if gm is not None else None
        if value is None:
            return (f"its {what} is computed in the program, so it cannot be checked before the engine runs "
                    f"(eager raises for {'a zero divisor' if kind == 'nonzero' else 'an index out of range'})")
        if not _holds(value, kind, lo, hi):
            return f"a constant {what} eager refuses"
    return None


class ArgumentCheck:
    """Per call of one cluster: do the arguments that feed its index and divisor operands hold?
    `sub`'s placeholders are the cluster's arguments in order; positions in `constants` are
    bound at compile time (the capability checked them). False: run the call in PyTorch."""

    def __init__(self, sub: GraphModule, constants: dict | None = None):
        constants = constants or {}
        position = {n: i for i, n in enumerate(n for n in sub.graph.nodes if n.op == "placeholder")}
        merged: dict[tuple[int, str], list[int]] = {}
        for node in sub.graph.nodes:
            for operand, kind, lo, hi in requirements(node) or []:
                root = _root(operand) if isinstance(operand, Node) else None
                pos = position.get(root)
                if pos is None or pos in constants:
                    continue
                key = (pos, kind)
                if key in merged:   # the strictest of the requirements on one argument
                    merged[key] = [max(merged[key][0], lo), min(merged[key][1], hi)]
                else:
                    merged[key] = [lo, hi]
        self.checks = [(pos, kind, lo, hi) for (pos, kind), (lo, hi) in merged.items()]

    @property
    def needed(self) -> bool:
        return bool(self.checks)

    def __call__(self, args) -> bool:
        return all(_holds(args[pos], kind, lo, hi) for pos, kind, lo, hi in self.checks)
