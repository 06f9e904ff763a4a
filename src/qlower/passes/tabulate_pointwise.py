"""TabulatePointwise: a float pointwise region of one 8-bit dequantize becomes one 256-entry
table lookup, computed once at compile time.

Preconditions: CanonicalizeQDQ ran (qlower.dequantize / qlower.quantize carry QParams).
BEFORE:  d = qlower.dequantize(q, s, zp)            # q: uint8/int8, per tensor
         y = aten.gelu(d)                            # any region of pointwise ops reading only d
         r = qlower.quantize(y, s2, zp2, lo, hi, dt) #   and scalar constants (x * sigmoid(x), ...)
AFTER:   r = qlower.table(q, T)    with T[c - dtype_min] = quantize(f(dequantize(c))) for every code c
and, where the region's result stays float (read by a float op, LLaMA's silu(gate) * up):
BEFORE:  d = qlower.dequantize(q, s, zp)   y = aten.silu(d)   z = aten.mul(y, other)
AFTER:   y = qlower.table(q, F)    with F[c - dtype_min] = f(dequantize(c)), fp32
Why: the region's output depends on one 8-bit code only, so T holds every possible answer,
computed by the same ops the reference backend runs. A float island that each engine computes
with its own kernels (GELU, sigmoid, exp; measured: onnxruntime, IREE and OpenVINO each differ
from PyTorch in the last bit of sqrt or division on this CPU; SiLU on 2^16 inputs: IREE 15,288
and onnxruntime 40,997 differ) becomes a gather, which every backend computes bit for bit — and
a gather of 256 entries is cheaper than the float math. A float-result region is tabulated only
when it holds an op that engines round differently (not for x * 2 or relu, which are single IEEE
operations already).
Near misses left alone: a per-channel or int32 dequantize (one code does not decide the value),
an op that is not pointwise (softmax, layer_norm, a reduction) or is random, a second tensor
operand that is not the same dequantize or a one-element constant, a region value read outside
the region (it must stay float there), a dequantize feeding the quantize directly (nothing to
tabulate), a 16-bit code (65,536 entries), a float result that is not fp32 or holds only
exactly rounded ops.
Postconditions: no quantize whose input is such a region, no such float region holding an
inexactly rounded op; outputs identical to the reference backend's evaluation of the same ops on
every code. Idempotent.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from .. import numerics
from ..errors import PassError
from ..fx import add_constant, call, constant_value
from ..meta import QPARAMS_KEY
from .base import Pass, PassContext, is_eight_bit_dequantize, replace_and_drop

qlower = torch.ops.qlower
aten = torch.ops.aten
_EIGHT_BIT = (torch.uint8, torch.int8)
# Elementwise ops that torch does not tag `pointwise` (torch 2.13)
_UNTAGGED_POINTWISE = frozenset({aten.hardswish.default, aten._to_copy.default, aten.where.ScalarOther,
                                 aten.where.ScalarSelf, aten.where.Scalar})
# Pointwise ops that are one correctly rounded IEEE operation (or none) on every engine: a
# float-result region of only these is left as it is
_ROUNDED_ALIKE = frozenset({aten.neg.default, aten.abs.default, aten.relu.default, aten.clamp.default,
                            aten.hardtanh.default, aten.mul.Tensor, aten.mul.Scalar, aten.add.Tensor,
                            aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.div.Tensor,
                            aten.div.Scalar, aten.pow.Tensor_Scalar, aten.clone.default, aten._to_copy.default,
                            aten.maximum.default, aten.minimum.default})


class TabulatePointwise(Pass):
    name = "tabulate_pointwise"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for q in list(gm.graph.nodes):
            found = _region_before(gm, q)
            if found is None:
                continue
            dq, region = found
            table = _table(gm, dq, region, q)
            with gm.graph.inserting_before(q):
                table_node = add_constant(gm, table, "table")
                new = call(gm, qlower.table.default, (dq.args[0], table_node), like=q)
            new.meta[QPARAMS_KEY] = q.meta[QPARAMS_KEY]
            replace_and_drop(gm, q, new, region, dq)
            ctx.rewrites["pointwise region -> qlower.table"] += 1
            changed = True
        erased: set[Node] = set()
        for end in reversed(list(gm.graph.nodes)):   # latest first: the largest region
            found = None if end in erased else _float_region_ending_at(gm, end)
            if found is None:
                continue
            dq, region = found
            table = _evaluate(gm, dq, region, end).reshape(-1)
            with gm.graph.inserting_before(end):
                table_node = add_constant(gm, table, "float_table")
                new = call(gm, qlower.table.default, (dq.args[0], table_node), like=end)
            replace_and_drop(gm, end, new, region[:-1], dq)
            erased.update(region)
            ctx.rewrites["pointwise region -> fp32 qlower.table"] += 1
            changed = True
        return changed


def _eight_bit_per_tensor(node: Node) -> bool:
    """An 8-bit quantize with one scale and zero point."""
    qp = node.meta.get(QPARAMS_KEY)
    return qp is not None and not qp.per_channel and qp.dtype in _EIGHT_BIT


def _pointwise(node: Node) -> bool:
    target = node.target
    tags = getattr(target, "tags", ())
    schema = getattr(target, "_schema", None)
    return node.op == "call_function" and (torch.Tag.pointwise in tags or target in _UNTAGGED_POINTWISE) \
        and torch.Tag.nondeterministic_seeded not in tags and schema is not None and not schema.is_mutable


def _scalar_constant(gm: GraphModule, node: Node) -> bool:
    if node.op != "get_attr":
        return False
    value = constant_value(gm, node)
    return value is not None and value.numel() == 1


def _region_before(gm: GraphModule, q: Node) -> tuple[Node, list[Node]] | None:
    """(the dequantize, the region's nodes in graph order) when `q` quantizes a pointwise region
    of one 8-bit per-tensor dequantize, else None."""
    if q.op != "call_function" or q.target is not qlower.quantize.default or not _eight_bit_per_tensor(q):
        return None
    start = q.args[0]
    if not isinstance(start, Node) or not _pointwise(start):
        return None
    found = _region_ending_at(gm, start, exits={q})
    if found is None or not start.meta["val"].dtype.is_floating_point:
        return None
    return found


def _float_region_ending_at(gm: GraphModule, end: Node) -> tuple[Node, list[Node]] | None:
    """(the dequantize, the region's nodes in graph order, `end` last) when `end` is an fp32
    pointwise region of one 8-bit per-tensor dequantize that holds an inexactly rounded op and
    is not quantized next (the quantized form is the integer table's), else None."""
    val = end.meta.get("val")
    if not _pointwise(end) or not isinstance(val, torch.Tensor) or val.dtype != torch.float32 \
            or any(u.target is qlower.quantize.default for u in end.users):
        return None
    found = _region_ending_at(gm, end, exits=set(end.users))
    if found is None or all(n.target in _ROUNDED_ALIKE for n in found[1]):
        return None
    return found


def _region_ending_at(gm: GraphModule, end: Node, exits: set[Node]) -> tuple[Node, list[Node]] | None:
    """(the dequantize, the region's nodes in graph order) when `end` is computed by pointwise
    ops from one 8-bit per-tensor dequantize and scalar constants, every region value read only
    inside the region or (`end`'s) by `exits`, and `end` has the dequantize's shape; else None."""
    region: set[Node] = set()
    dq: Node | None = None
    stack = [end]
    while stack:
        node = stack.pop()
        if node in region:
            continue
        if node.op == "call_function" and node.target is qlower.dequantize.default:
            if not is_eight_bit_dequantize(node) or (dq is not None and node is not dq):
                return None
            dq = node
        elif _pointwise(node):
            region.add(node)
            stack.extend(node.all_input_nodes)
        elif not _scalar_constant(gm, node):
            return None
    if dq is None or any(user not in region and not (node is end and user in exits)
                         for node in region for user in node.users):
        return None
    if tuple(end.meta["val"].shape) != tuple(dq.meta["val"].shape):
        return None
    return dq, [n for n in gm.graph.nodes if n in region]


def _table(gm: GraphModule, dq: Node, region: list[Node], q: Node) -> torch.Tensor:
    """quantize(region(dequantize(c))) for every code c of the dequantize's input, in code order."""
    return _evaluate(gm, dq, region, q).reshape(-1)


def _evaluate(gm: GraphModule, dq: Node, region: list[Node], last: Node) -> torch.Tensor:
    """`last` (the region's end, or the quantize after it) on every code of the dequantize's
    input, in code order, computed by the region's own ops."""
    codes = numerics.table_codes(dq.args[0].meta["val"].dtype)
    env: dict[Node, object] = {}

    def value(arg):
        if isinstance(arg, Node):
            return env[arg] if arg in env else constant_value(gm, arg)
        if isinstance(arg, (list, tuple)):
            return type(arg)(value(a) for a in arg)
        return arg

    env[dq.args[0]] = codes
    env[dq] = dq.target(*value(dq.args), **value(dq.kwargs))
    for node in region:
        env[node] = node.target(*value(node.args), **value(node.kwargs))
    table = env[last] if last in env else last.target(*value(last.args), **value(last.kwargs))
    if table.numel() != codes.numel():   # the shape checks in _region_ending_at rule this out
        raise PassError(f"a pointwise region changed the number of elements ({table.numel()} from "
                        f"{codes.numel()} codes)", node=last.name)
    return table
