"""TabulatePointwise: a float pointwise region between an 8-bit dequantize and an 8-bit quantize
becomes one 256-entry table lookup, computed once at compile time.

Preconditions: CanonicalizeQDQ ran (qlower.dequantize / qlower.quantize carry QParams).
BEFORE:  d = qlower.dequantize(q, s, zp)            # q: uint8/int8, per tensor
         y = aten.gelu(d)                            # any region of pointwise ops reading only d
         r = qlower.quantize(y, s2, zp2, lo, hi, dt) #   and scalar constants (x * sigmoid(x), ...)
AFTER:   r = qlower.table(q, T)    with T[c - dtype_min] = quantize(f(dequantize(c))) for every code c
Why: the region's output depends on one 8-bit code only, so T holds every possible answer,
computed by the same ops the reference backend runs. A float island that each engine computes
with its own kernels (GELU, sigmoid, exp; measured: onnxruntime, IREE and OpenVINO each differ
from PyTorch in the last bit of sqrt or division on this CPU) becomes a gather, which every
backend computes bit for bit — and a gather of 256 entries is cheaper than the float math.
Near misses left alone: a per-channel or int32 dequantize (one code does not decide the value),
an op that is not pointwise (softmax, layer_norm, a reduction) or is random, a second tensor
operand that is not the same dequantize or a one-element constant, a region value read outside
the region (it must stay float there), a dequantize feeding the quantize directly (nothing to
tabulate), a 16-bit code (65,536 entries).
Postconditions: no quantize whose input is such a region; outputs identical to the reference
backend's evaluation of the same ops on every code. Idempotent.
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
    region: set[Node] = set()
    dq: Node | None = None
    stack = [start]
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
    if dq is None or any(user is not q and user not in region for node in region for user in node.users):
        return None
    if tuple(start.meta["val"].shape) != tuple(dq.meta["val"].shape) or not start.meta["val"].dtype.is_floating_point:
        return None
    return dq, [n for n in gm.graph.nodes if n in region]


def _table(gm: GraphModule, dq: Node, region: list[Node], q: Node) -> torch.Tensor:
    """quantize(region(dequantize(c))) for every code c of the dequantize's input, in code order."""
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
    table = q.target(*value(q.args), **value(q.kwargs)).reshape(-1)
    if table.numel() != codes.numel():   # the shape check in _region_before rules this out
        raise PassError(f"a pointwise region changed the number of elements ({table.numel()} from "
                        f"{codes.numel()} codes)", node=q.name)
    return table
