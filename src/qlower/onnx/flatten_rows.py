"""FlattenRows: keep activations between QGemms two-dimensional, so the Reshape pairs the
2-D QGemm formulation needs cancel (an ONNX-level peephole pass on an emitted cluster).

com.microsoft QGemm takes 2-D inputs, so the emitter wraps each linear on a [B, S, K] input in
Reshape([-1, K]) -> QGemm -> Reshape([B, S, N]). Between two linears of a transformer block sit
only row-wise ops (QLinearAdd, Dequantize/Quantize per tensor, LayerNormalization over the last
axis, Gelu, ...), which compute the same values on a [B*S, N] view. This pass moves each
"unflatten" Reshape below such ops and drops Reshape(Reshape(v2d, [B, S, N]), [-1, N]) pairs.

Preconditions: nodes in topological order; Reshape targets that matter are initializers.
BEFORE:  y2 = QGemm(..)  y = Reshape(y2, [1,16,64])  z = QLinearAdd(y, .., r, ..)  w = Reshape(z, [-1,64])
AFTER:   y2 = QGemm(..)  r2 = Reshape(r, [-1,64])  z2 = QLinearAdd(y2, .., r2, ..)  w = z2
         (z = Reshape(z2, [1,16,64]) is kept only while something still reads z)
Postconditions: same values on every graph output (only views move; every op kept is row-wise).
Idempotent: a second run finds no unflatten Reshape followed by a row-wise op.
"""
from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper, numpy_helper

# op type -> positions of its data inputs (the other inputs must be scalars or per-last-axis)
_ROWWISE = {
    "QLinearAdd": (0, 3), "Add": (0, 1), "Sub": (0, 1), "Mul": (0, 1),
    "DequantizeLinear": (0,), "QuantizeLinear": (0,), "LayerNormalization": (0,), "Gelu": (0,),
    "Relu": (0,), "Sigmoid": (0,), "Tanh": (0,), "Erf": (0,), "Clip": (0,), "Identity": (0,),
    "Cast": (0,), "Softmax": (0,),
}


def flatten_rows(nodes: list[NodeProto], inits: list, shapes: dict[str, tuple[int, ...]],
                 graph_outputs: set[str]) -> tuple[list[NodeProto], list]:
    """(new nodes, new initializers); `shapes` gives static shapes of named values."""
    consts = {t.name: numpy_helper.to_array(t) for t in inits}
    producer: dict[str, NodeProto] = {}
    flat: dict[str, tuple[str, tuple[int, ...]]] = {}   # 3-D value -> (its 2-D rows, its shape)
    flattened: dict[str, str] = {}                      # 3-D value -> a Reshape([-1, N]) of it
    alias: dict[str, str] = {}
    new_inits, out = [], []
    counter = [0]

    def fresh(hint: str) -> str:
        counter[0] += 1
        return f"{hint}__rows{counter[0]}"

    def shape_const(shape) -> str:
        name = fresh("shape")
        new_inits.append(numpy_helper.from_array(np.array(shape, np.int64), name))
        consts[name] = np.array(shape, np.int64)
        return name

    for node in nodes:
        node.input[:] = [alias.get(i, i) for i in node.input]
        if node.op_type == "Reshape" and node.input[1] in consts:
            target = tuple(int(d) for d in consts[node.input[1]])
            src = node.input[0]
            if src in flat and _is_rows_of(target, flat[src][1]):
                alias[node.output[0]] = flat[src][0]       # Reshape(unflatten(v2d)) == v2d
                continue
            if getattr(producer.get(src), "op_type", None) == "QGemm" and len(target) >= 3 and min(target) > 0:
                flat[node.output[0]] = (src, target)
            elif src in shapes and len(shapes[src]) >= 3 and _is_rows_of(target, shapes[src]):
                flattened.setdefault(src, node.output[0])   # reused when src is needed as rows
        elif _rowwise(node, consts):
            rewritten = _on_rows(node, flat, flattened, shapes, consts, fresh, shape_const, out)
            if rewritten is not None:
                rows_node, shape = rewritten
                out.append(rows_node)
                unflatten = helper.make_node("Reshape", [rows_node.output[0], shape_const(shape)], [node.output[0]])
                out.append(unflatten)
                flat[node.output[0]] = (rows_node.output[0], shape)
                for o in (rows_node, unflatten):
                    for name in o.output:
                        producer[name] = o
                continue
        out.append(node)
        for name in node.output:
            producer[name] = node
    kept = _live(out, graph_outputs)
    used = {i for n in kept for i in n.input}
    return kept, [t for t in inits + new_inits if t.name in used]


def _is_rows_of(target: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    rows = int(np.prod(shape[:-1]))
    return len(target) == 2 and target[1] == shape[-1] and target[0] in (-1, rows)


def _rowwise(node: NodeProto, consts: dict) -> bool:
    if node.op_type not in _ROWWISE or len(node.output) != 1:
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type in ("LayerNormalization", "Softmax") and attrs.get("axis", -1) != -1:
        return False
    if node.op_type in ("DequantizeLinear", "QuantizeLinear") and consts.get(node.input[1], np.zeros(2)).size != 1:
        return False  # per-channel: the axis would move
    data = _ROWWISE[node.op_type]
    return all(i in data or not name or (name in consts and consts[name].ndim <= 1)
               for i, name in enumerate(node.input))


def _on_rows(node, flat, flattened, shapes, consts, fresh, shape_const, out):
    """The node rewritten onto 2-D rows, or None when its data inputs are not all available as
    rows of one shape (at least one must already be)."""
    data = [i for i in _ROWWISE[node.op_type] if i < len(node.input) and node.input[i]
            and not (node.input[i] in consts and consts[node.input[i]].size == 1)]
    shape = next((flat[node.input[i]][1] for i in data if node.input[i] in flat), None)
    if shape is None:
        return None
    rows = list(node.input)
    for i in data:
        name = node.input[i]
        if name in flat and flat[name][1] == shape:
            rows[i] = flat[name][0]
        elif name in consts and consts[name].ndim <= 1 and consts[name].size in (1, shape[-1]):
            continue  # a per-last-axis constant broadcasts over rows as it did over [B, S, N]
        elif shapes.get(name) == shape:
            if name not in flattened:
                flattened[name] = fresh(name)
                out.append(helper.make_node("Reshape", [name, shape_const([-1, shape[-1]])], [flattened[name]]))
            rows[i] = flattened[name]
        else:
            return None
    for i, name in enumerate(node.input):  # per-last-axis parameters (LayerNorm scale) must be 1-D [N]
        if i not in data and name in consts and consts[name].ndim == 1 and consts[name].size not in (1, shape[-1]):
            return None
    rows_node = NodeProto()
    rows_node.CopyFrom(node)
    rows_node.input[:] = rows
    rows_node.output[:] = [fresh(node.output[0])]
    return rows_node, shape


def _live(nodes: list[NodeProto], graph_outputs: set[str]) -> list[NodeProto]:
    needed, kept = set(graph_outputs), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    return kept[::-1]
