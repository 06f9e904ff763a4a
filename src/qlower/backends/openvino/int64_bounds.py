"""Bounds on the magnitude of int64 values, for OpenVINO, whose CPU plugin computes int64 in
int32 (openvinotoolkit/openvino#35823; measured with openvino 2026.4.1: an int64 input of 5e9
came back from a reshape as 705032704; `x + 1`, `cumsum`, `(x * 3).sum()` wrapped the same way,
silently).

`Int64Bounds(leaf).of(node)` is an upper bound on |v| over every value `node` produces, from
the bounds of what it reads: `leaf(node)` for the values that enter from outside (graph inputs,
module state, run-time arguments of a cluster), constants' largest value, integer arguments,
sizes (the shape environment's upper bound: a declared Dim max), and per op: data movement and
selection keep the bound, sums and differences add, products multiply, a sum over n elements
multiplies by n, positions (argmax, sort) are bounded by the size; an op not listed, or a float
-> int64 cast, is unbounded.

Two uses: the capability refuses a node whose op is unbounded even for bounded operands
(`bounded_op`); every OpenVINO cluster re-evaluates its int64 nodes on each call from the actual
largest |value| of its int64 arguments (`RangeCheck`), and runs that call in PyTorch when one
could leave int32 — exact for any input, and no cluster is split for a product of masks.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch.fx import GraphModule, Node

from ...fx import constant_value, full_args, schema_name
from ...shapes import size_bound

INT32_MAX = 2 ** 31 - 1
UNBOUNDED = math.inf
Leaf = Callable[[Node], "float | None"]

_CASTS = ("_to_copy", "to.dtype", "to.dtype_layout", "to.device", "to.other", "type_as")
# ops whose output values are values of their inputs or of their integer arguments (data
# movement, selection): bound = the largest of those
_SELECTING = frozenset(f"aten::{name}" for name in (
    "view", "_unsafe_view", "reshape", "expand", "expand_as", "permute", "transpose.int", "t", "squeeze",
    "squeeze.dim", "squeeze.dims", "unsqueeze", "slice.Tensor", "select.int", "index.Tensor", "index_select",
    "gather", "cat", "stack", "clone", "contiguous", "alias", "flatten.using_ints", "unflatten", "unbind.int",
    "split.Tensor", "split_with_sizes", "chunk", "narrow", "repeat", "flip", "roll", "where.self",
    "maximum", "minimum", "max.other", "min.other", "amax", "amin", "lift_fresh_copy", "detach",
    "abs", "neg", "index_put", "slice_scatter", "select_scatter", "scatter.src", "scatter.value",
    "masked_scatter", "index_copy", "diagonal", "tril", "triu", "movedim.int", "_assert_tensor_metadata",
    *_CASTS)) | {"getitem"}
# ... of which these write an integer argument into the output (slice ends such as INT64_MAX and
# shapes do not become values)
_VALUE_ARGUMENTS = frozenset(f"aten::{name}" for name in (
    "full", "full_like", "new_full", "scalar_tensor", "where.ScalarOther", "where.ScalarSelf", "masked_fill.Scalar",
    "clamp", "clamp_min", "clamp_max", "constant_pad_nd", "arange", "arange.start", "arange.start_step",
    "zeros", "ones", "zeros_like", "ones_like", "new_zeros", "new_ones"))
# ops returning positions (alone, or beside values of their input): bounded by the input's size
_INDEXING = frozenset(f"aten::{name}" for name in ("argmax", "argmin", "max.dim", "min.dim", "sort", "topk"))
_ADDITIVE = frozenset({"aten::add.Tensor", "aten::sub.Tensor", "aten::rsub.Scalar", "aten::add.Scalar",
                       "aten::sub.Scalar", "aten::rsub.Tensor"})
_REDUCING = frozenset({"aten::sum.dim_IntList", "aten::sum", "aten::cumsum"})


def produces_int64(node: Node) -> bool:
    return any(getattr(t, "dtype", None) is torch.int64 for t in _tensors(node.meta.get("val")))


class Int64Bounds:
    """Bounds of a graph's values, memoized, given `leaf` (None: not a leaf, use the op's rule)."""

    def __init__(self, leaf: Leaf):
        self.leaf, self.memo = leaf, {}

    def of(self, node: Node) -> float:
        if node not in self.memo:
            given = self.leaf(node)
            self.memo[node] = given if given is not None else _bound(node, self._operand)
        return self.memo[node]

    def _operand(self, arg) -> float:
        if isinstance(arg, Node):
            return self.of(arg)
        return _number(arg)


def bounded_op(node: Node) -> bool:
    """Whether `node`'s rule gives a finite bound when everything it reads is bounded."""
    return math.isfinite(_bound(node, lambda a: 1.0 if isinstance(a, Node) else _number(a)))


def _is_state(node: Node) -> bool:
    return node.op == "get_attr" and constant_value(node.graph.owning_module, node) is None


class RangeCheck:
    """Per call of one cluster: do all its int64 values stay inside int32, given its arguments?
    `sub`'s placeholders are the cluster's arguments in order; `constants` the ones bound at
    compile time. Monotone: a call whose int64 arguments are no larger than an earlier passing
    call's passes without re-evaluating."""

    def __init__(self, sub: GraphModule, constants: dict[int, torch.Tensor]):
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        self.nodes = [n for n in sub.graph.nodes if n.op == "call_function" and produces_int64(n)]
        # without int64 arithmetic inside, only int64 arguments can be wrong (truncated on entry);
        # an int8 cluster's uint8 activations are not scanned on every call
        self.positions = {n: i for i, n in enumerate(placeholders) if i not in constants
                          and (produces_int64(n) or (self.nodes and _integral(n)))}
        self.constants = {n: _largest(constants[i]) for i, n in enumerate(placeholders) if i in constants}
        self.passed: tuple[float, ...] | None = None

    @property
    def needed(self) -> bool:
        return bool(self.positions or self.nodes)

    def __call__(self, args) -> bool:
        largest = tuple(_largest(args[i]) for i in self.positions.values())
        if any(v > INT32_MAX for v in largest):
            return False
        if self.passed is not None and all(v <= p for v, p in zip(largest, self.passed)):
            return True
        given = dict(zip(self.positions, largest))
        bounds = Int64Bounds(lambda n: given.get(n, self.constants.get(n, 0.0 if n.op == "placeholder" else None)))
        if all(bounds.of(n) <= INT32_MAX for n in self.nodes):
            self.passed = largest
            return True
        return False


def _bound(node: Node, operand: Callable[[object], float]) -> float:
    """`node`'s bound by its op's rule, reading its operands' bounds through `operand`."""
    if node.op == "placeholder" or _is_state(node):
        return UNBOUNDED        # a leaf: the caller knows its bound
    if node.op == "get_attr":
        value = constant_value(node.graph.owning_module, node)
        if value.dtype.is_floating_point or value.dtype.is_complex:
            return UNBOUNDED
        return _largest(value)
    if node.op != "call_function":
        return UNBOUNDED
    val = node.meta.get("val")
    if isinstance(val, (int, torch.SymInt)) and not isinstance(val, bool):
        return size_bound(val)
    if _tensors(val) and all(t.dtype is torch.bool for t in _tensors(val)):
        return 1.0
    name = schema_name(node)
    if name.removeprefix("aten::") in _CASTS and any(_is_float(a) for a in node.all_input_nodes):
        return UNBOUNDED        # a float -> int64 cast (OpenVINO gives INT32_MIN for large floats)
    args = full_args(node) if getattr(node.target, "_schema", None) is not None else list(node.args)
    if name == "aten::copy":           # copy(self, src): src's values in self's place
        return operand(args[1])
    if name in _INDEXING:
        x = node.all_input_nodes[0]
        positions = math.prod(size_bound(d) for d in x.meta["val"].shape)
        return max(positions, operand(x) if _is_integer(x) else 0.0)
    if name in _SELECTING or name in _VALUE_ARGUMENTS:
        numbers = _numbers(args) if name in _VALUE_ARGUMENTS else []
        return max([operand(a) for a in node.all_input_nodes if _is_integer(a)] + numbers + [0.0])
    if name in _ADDITIVE:
        alpha = abs(args[2]) if len(args) > 2 and isinstance(args[2], (int, float)) else 1
        return operand(args[0]) + alpha * operand(args[1])
    if name in ("aten::mul.Tensor", "aten::mul.Scalar"):
        return operand(args[0]) * operand(args[1])
    if name in _REDUCING:
        x = args[0]
        dims = args[1] if len(args) > 1 and args[1] is not None else list(range(x.meta["val"].dim()))
        dims = [dims] if isinstance(dims, int) else dims
        count = math.prod(size_bound(x.meta["val"].shape[d]) for d in dims) if dims else 1
        return operand(x) * count
    if name in ("aten::floor_divide", "aten::div.Tensor_mode", "aten::div.Scalar_mode"):
        return operand(args[0])
    if name in ("aten::remainder.Scalar", "aten::remainder.Tensor", "aten::fmod.Scalar", "aten::fmod.Tensor"):
        return min(operand(args[0]), operand(args[1]))
    return UNBOUNDED


def _number(arg) -> float:
    if isinstance(arg, bool):
        return 1.0
    if isinstance(arg, (int, torch.SymInt)):
        return size_bound(arg)
    if isinstance(arg, float):
        return abs(arg) if math.isfinite(arg) else UNBOUNDED
    return UNBOUNDED


def _numbers(args) -> list[float]:
    out = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out += _numbers(a)
        elif isinstance(a, (int, torch.SymInt, float)) and not isinstance(a, bool):
            out.append(_number(a))
    return out


def _largest(t) -> float:
    """max |v| of an integer or bool tensor, or of a Python int (a size)."""
    if not isinstance(t, torch.Tensor):
        return float(abs(int(t)))
    if t.numel() == 0 or t.dtype.is_floating_point or t.dtype.is_complex:
        return 0.0 if t.numel() == 0 else UNBOUNDED
    if t.dtype is torch.bool:
        return float(bool(t.any()))
    lo, hi = torch.aminmax(t.reshape(-1))
    return float(max(abs(int(lo)), abs(int(hi))))


def _integral(node: Node) -> bool:
    """An argument whose values can enter int64 arithmetic: an integer or bool tensor, a size."""
    val = node.meta.get("val")
    if isinstance(val, (int, torch.SymInt)):
        return True
    return isinstance(val, torch.Tensor) and not val.dtype.is_floating_point and not val.dtype.is_complex


def _is_integer(node) -> bool:
    """An integer tensor (not bool) or an integer size."""
    val = getattr(node, "meta", {}).get("val")
    if isinstance(val, (int, torch.SymInt)) and not isinstance(val, bool):
        return True
    tensors = _tensors(val)
    return bool(tensors) and all(not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype is not torch.bool
                                 for t in tensors)


def _is_float(node) -> bool:
    return any(t.dtype.is_floating_point for t in _tensors(getattr(node, "meta", {}).get("val")))


def _tensors(val) -> list[torch.Tensor]:
    return [t for t in (val if isinstance(val, (tuple, list)) else [val]) if isinstance(t, torch.Tensor)]
