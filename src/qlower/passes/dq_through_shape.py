"""Shared mechanics of FoldQuantizedConstants and PropagateDequantize: move a dequantize below
a shape-only op, re-deriving the QParams with `qlower.axis`."""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ..axis import SHAPE_OPS, derive, derive_concat
from ..fx import add_constant, call, constant_value, is_dequantize
from ..meta import QPARAMS_KEY, QParams

qd = torch.ops.quantized_decomposed
aten = torch.ops.aten


def dequantize_node(gm: GraphModule, q: Node, qp: QParams, like: Node) -> Node:
    """A quantized_decomposed dequantize of `q` described by `qp`, with QParams attached."""
    if qp.per_channel:
        scale = add_constant(gm, qp.scale_tensor(), "scale")
        zp = add_constant(gm, torch.tensor(qp.zero_point, dtype=torch.int64), "zp")
        node = call(gm, qd.dequantize_per_channel.default, (q, scale, zp, qp.axis, qp.qmin, qp.qmax, qp.dtype),
                    like=like)
    else:
        node = call(gm, qd.dequantize_per_tensor.default,
                    (q, qp.scale[0], qp.zero_point[0], qp.qmin, qp.qmax, qp.dtype), like=like)
    node.meta[QPARAMS_KEY] = qp
    return node


def dq_input(node: Node) -> Node | None:
    """The dequantize feeding a shape op's data input, if any (with QParams)."""
    src = node.args[0] if node.args else None
    return src if is_dequantize(src) and QPARAMS_KEY in src.meta else None


def static_args(node: Node) -> bool:
    return not any(isinstance(a, Node) for a in torch.utils._pytree.tree_leaves((node.args[1:], node.kwargs)))


def derived_qparams(node: Node) -> QParams | str | None:
    """QParams after `node` (a shape op or a cat of dequantized inputs), or a refusal string;
    None when the node is not a candidate at all."""
    if node.op != "call_function":
        return None
    if node.target in (aten.cat.default, aten.concat.default):
        inputs = node.args[0]
        if not inputs or not all(is_dequantize(i) and QPARAMS_KEY in i.meta for i in inputs):
            return None
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        return derive_concat([i.meta[QPARAMS_KEY] for i in inputs], dim,
                             [tuple(i.meta["val"].shape) for i in inputs])
    if node.target not in SHAPE_OPS or dq_input(node) is None or not static_args(node):
        return None
    dq = dq_input(node)
    return derive(node.target, tuple(node.args[1:]), tuple(dq.meta["val"].shape), dq.meta[QPARAMS_KEY])


def integer_inputs(node: Node) -> list[Node]:
    if node.target in (aten.cat.default, aten.concat.default):
        return [i.args[0] for i in node.args[0]]
    return [node.args[0].args[0]]


def constant_inputs(gm: GraphModule, node: Node) -> list[torch.Tensor] | None:
    values = [constant_value(gm, q) for q in integer_inputs(node)]
    return None if any(v is None for v in values) else values


def apply_on_integers(node: Node, values):
    """Evaluate the shape op on integer tensors (Nodes or constants)."""
    if node.target in (aten.cat.default, aten.concat.default):
        return node.target(values, *node.args[1:], **node.kwargs)
    return node.target(values[0], *node.args[1:], **node.kwargs)
