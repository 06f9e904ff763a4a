"""Block ops in ONNX: each block op becomes ONE ONNX node.

- The standard op where ONNX has one with the same semantics (opset 23):
  layer_norm -> LayerNormalization, rms_norm -> RMSNormalization, group_norm -> GroupNormalization,
  attention / aten SDPA -> Attention (grouped-query heads, causal, float or boolean masks,
  symbolic shapes).
- Otherwise a node in the custom domain `qlower` (op_type = the block op's name) whose
  FunctionProto body is the op's decomposition in standard ONNX, so any ONNX runtime can run it
  (ONNX Runtime inlines it when the session loads): skip_layer_norm, group_norm + SiLU,
  masked_softmax (mask and lengths modes), rotary_embedding (half-split and interleaved),
  kv_cache_update, stream_buffer, lstm, gru. The lstm / gru bodies are ONNX LSTM / GRU nodes,
  gates reordered from PyTorch's (i, f, g, o) / (r, z, n) to ONNX's (i, o, f, c) / (z, r, h),
  one node per layer, with the `reset` input zeroing the incoming state.

Bodies are specialised per variant (eps, dim, interleaved, ... are baked in); identical bodies
share one FunctionProto, told apart from other variants by its `overload` field. Small constants
live in the body; weights are model initializers passed to the function as extra inputs.
"""
from __future__ import annotations

import hashlib
from typing import Callable

import numpy as np
import torch
from onnx import TensorProto, helper
from torch.fx import Node

from .emit import Emitter

BLOCK_DOMAIN = "qlower"
aten = torch.ops.aten
q = torch.ops.qlower
_INT64_MAX = np.iinfo(np.int64).max


# ------------------------------------------------------------------------------ helpers
def _i64(e: Emitter, values, hint: str = "i") -> str:
    return e.const(np.array(values, np.int64), hint)


def _slice(e: Emitter, x: str, start, end, axis: int, step: int = 1) -> str:
    """Slice along one axis; start/end are ints or names of 1-element int64 tensors."""
    st = start if isinstance(start, str) else _i64(e, [start], "st")
    en = end if isinstance(end, str) else _i64(e, [end], "en")
    return e.op("Slice", [x, st, en, _i64(e, [axis], "ax"), _i64(e, [step], "sp")])


def _dim(e: Emitter, x: str, axis: int) -> str:
    """Size of one axis of x as a 1-element int64 tensor (works for symbolic sizes)."""
    return e.op("Shape", [x], start=axis) if axis == -1 else e.op("Shape", [x], start=axis, end=axis + 1)


def _keep_flag(e: Emitter, reset: str) -> str:
    """float 1.0 where reset is false, 0.0 where it is true (a 0-d scalar)."""
    flag = e.op("Reshape", [reset, e.const(np.zeros(0, np.int64), "scalar")])
    return e.op("Cast", [e.op("Not", [flag])], to=TensorProto.FLOAT)


def _tensor_args(node: Node) -> list[Node]:
    """The function's FX tensor inputs, unique: top-level arguments, plus aten.lstm's state list
    (weight lists are not inputs: the bodies hoist them, reordered, as initializers)."""
    args = list(node.args)
    if node.target in (aten.lstm.input, aten.gru.input):
        args = [args[0], *(args[1] if isinstance(args[1], (list, tuple)) else [args[1]])]
    seen: dict[str, Node] = {}
    for a in args:
        if isinstance(a, Node):
            seen.setdefault(a.name, a)
    return list(seen.values())


def _emit_function_node(e: Emitter, node: Node, body: Callable[[Emitter, Node], list[str] | None]) -> bool:
    sub = Emitter(e.gm, e.constants, parent=e)
    results = body(sub, node)
    if results is None:
        return False
    inputs = [a.name for a in _tensor_args(node)] + sub.hoisted
    rename = {n: f"x{i}" for i, n in enumerate(inputs)}
    rename.update({n: f"y{i}" for i, n in enumerate(results)})
    body_nodes = []
    for n in sub.nodes:
        n.input[:] = [rename.get(i, i) for i in n.input]
        n.output[:] = [rename.get(o, o) for o in n.output]
        body_nodes.append(n)
    name = node.target._schema.name.split("::")[-1]   # aten's lstm/gru: in the qlower domain too
    overload = hashlib.sha1(b"".join(n.SerializeToString() for n in body_nodes)).hexdigest()[:12]
    if (name, overload) not in e.functions:
        from .emit import OPSET
        e.functions[(name, overload)] = helper.make_function(
            BLOCK_DOMAIN, name, [f"x{i}" for i in range(len(inputs))], [f"y{i}" for i in range(len(results))],
            body_nodes, [helper.make_opsetid("", OPSET)], overload=overload,
            doc_string=f"qlower block op {name}: decomposition into standard ONNX")
    outs = [node.name] if len(results) == 1 else [f"{node.name}__{i}" for i in range(len(results))]
    e.nodes.append(helper.make_node(name, inputs, outs, domain=BLOCK_DOMAIN, overload=overload))
    return True


# ------------------------------------------------------------------------------ standard ops
def _norm_affine(e: Emitter, w: Node | None, b: Node | None, size: int) -> tuple[str, str]:
    wn = w.name if w is not None else e.const(np.ones(size, np.float32), "ones")
    bn = b.name if b is not None else e.const(np.zeros(size, np.float32), "zeros")
    return wn, bn


def _layer_norm(e: Emitter, node: Node) -> bool:
    x, shape, w, b, eps = node.args
    wn, bn = _norm_affine(e, w, b, int(np.prod(shape)))
    e.op("LayerNormalization", [x.name, wn, bn], node.name, axis=-len(shape), epsilon=float(eps))
    return True


def _rms_norm(e: Emitter, node: Node) -> bool:
    x, shape, w, eps = node.args
    eps = float(np.finfo(np.float32).eps) if eps is None else float(eps)
    wn = w.name if w is not None else e.const(np.ones(shape, np.float32), "ones")
    e.op("RMSNormalization", [x.name, wn], node.name, axis=-len(shape), epsilon=eps)
    return True


def _group_norm(e: Emitter, node: Node) -> bool:
    x, groups, w, b, eps, silu = node.args
    if silu:
        return False  # two ops: emitted as a function
    wn, bn = _norm_affine(e, w, b, x.meta["val"].shape[1])
    e.op("GroupNormalization", [x.name, wn, bn], node.name, num_groups=int(groups), epsilon=float(eps))
    return True


def attention_args(node: Node) -> tuple:
    """(q, k, v, mask, causal, scale, dropout) of qlower::attention or aten SDPA."""
    if node.target is aten.scaled_dot_product_attention.default:
        a, kw = list(node.args) + [None] * 7, node.kwargs
        return (a[0], a[1], a[2], kw.get("attn_mask", a[3]), bool(kw.get("is_causal", a[5]) or False),
                kw.get("scale", a[6]), kw.get("dropout_p", a[4]) or 0.0)
    qn, kn, vn, mask, causal, scale = node.args
    return qn, kn, vn, mask, causal, scale, 0.0


def _mask_rows_expanded(e: Emitter, mask: Node, qn: Node, kn: Node) -> str:
    """ONNX Runtime wants the mask's query dimension spelled out (no broadcast there)."""
    shape = mask.meta["val"].shape
    if len(shape) >= 2 and shape[-2] == qn.meta["val"].shape[-2]:
        return mask.name
    target = e.op("Concat", [e.op("Shape", [mask.name], end=-2), e.op("Shape", [qn.name], start=-2, end=-1),
                             e.op("Shape", [kn.name], start=-2, end=-1)], axis=0) if len(shape) >= 2 else \
        e.op("Concat", [e.op("Shape", [qn.name], start=-2, end=-1), e.op("Shape", [kn.name], start=-2, end=-1)], axis=0)
    return e.op("Expand", [mask.name, target])


def _attention(e: Emitter, node: Node) -> bool:
    qn, kn, vn, mask, causal, scale, dropout = attention_args(node)
    if dropout:
        return False
    attrs = {"is_causal": int(causal)}
    if scale is not None:
        attrs["scale"] = float(scale)
    inputs = [qn.name, kn.name, vn.name]
    if mask is not None:
        inputs.append(_mask_rows_expanded(e, mask, qn, kn))
    e.op("Attention", inputs, node.name, **attrs)
    return True


# ------------------------------------------------------------------------------ function bodies
def _skip_layer_norm_body(e: Emitter, node: Node) -> list[str]:
    x, skip, shape, w, b, eps = node.args
    wn, bn = _norm_affine(e, w, b, int(np.prod(shape)))
    total = e.op("Add", [x.name, skip.name])
    return [e.op("LayerNormalization", [total, wn, bn], axis=-len(shape), epsilon=float(eps))]


def _group_norm_silu_body(e: Emitter, node: Node) -> list[str]:
    x, groups, w, b, eps, _ = node.args
    wn, bn = _norm_affine(e, w, b, x.meta["val"].shape[1])
    y = e.op("GroupNormalization", [x.name, wn, bn], num_groups=int(groups), epsilon=float(eps))
    return [e.op("Mul", [y, e.op("Sigmoid", [y])])]


def _masked_softmax_body(e: Emitter, node: Node) -> list[str]:
    scores, mask, lengths, dim = node.args
    s = e.op("Add", [scores.name, mask.name]) if mask is not None else scores.name
    if lengths is not None:
        n = e.op("Squeeze", [_dim(e, s, -1)])
        positions = e.op("Range", [e.const(np.int64(0), "zero"), n, e.const(np.int64(1), "one")])
        rank, lrank = scores.meta["val"].dim(), lengths.meta["val"].dim()
        lens = e.op("Cast", [lengths.name], to=TensorProto.INT64)
        if rank > lrank:
            lens = e.op("Unsqueeze", [lens, _i64(e, list(range(lrank, rank)), "axes")])
        keep = e.op("Less", [positions, lens])
        s = e.op("Where", [keep, s, e.const(np.float32(-np.inf), "ninf")])
    p = e.op("Softmax", [s], axis=int(dim))
    return [e.op("Where", [e.op("IsNaN", [p]), e.const(np.float32(0.0), "zero"), p])]  # fully masked rows -> 0


def _rotary_body(e: Emitter, node: Node) -> list[str]:
    x, cos, sin, interleaved = node.args
    d = x.meta["val"].shape[-1]
    if not isinstance(d, int):
        return None
    if interleaved:
        even, odd = _slice(e, x.name, 0, d, -1, 2), _slice(e, x.name, 1, d, -1, 2)
        last = _i64(e, [-1], "axes")
        pairs = e.op("Concat", [e.op("Unsqueeze", [e.op("Neg", [odd]), last]), e.op("Unsqueeze", [even, last])],
                     axis=-1)
        rotated = e.op("Reshape", [pairs, e.op("Shape", [x.name])])
    else:
        half = d // 2
        rotated = e.op("Concat", [e.op("Neg", [_slice(e, x.name, half, d, -1)]), _slice(e, x.name, 0, half, -1)],
                       axis=-1)
    return [e.op("Add", [e.op("Mul", [x.name, cos.name]), e.op("Mul", [rotated, sin.name])])]


def _kv_cache_update_body(e: Emitter, node: Node) -> list[str]:
    cache, new, position = node.args
    start = e.op("Reshape", [e.op("Cast", [position.name], to=TensorProto.INT64), _i64(e, [1], "shape")])
    end = e.op("Add", [start, _dim(e, new.name, 2)])
    before = _slice(e, cache.name, _i64(e, [0], "zero"), start, 2)
    after = _slice(e, cache.name, end, _INT64_MAX, 2)
    return [e.op("Concat", [before, new.name, after], axis=2)]


def _stream_buffer_body(e: Emitter, node: Node) -> list[str]:
    state, frame, reset = node.args
    kept = e.op("Mul", [state.name, _keep_flag(e, reset.name)])
    return [e.op("Concat", [_slice(e, kept, _dim(e, frame.name, 1), _INT64_MAX, 1), frame.name], axis=1)]


_LSTM_GATES = [0, 3, 1, 2]   # PyTorch (i, f, g, o) -> ONNX (i, o, f, c)
_GRU_GATES = [1, 0, 2]       # PyTorch (r, z, n)    -> ONNX (z, r, h)


def _gates(t: torch.Tensor, order: list[int]) -> torch.Tensor:
    return torch.cat([t.chunk(len(order))[i] for i in order])


def rnn_args(node: Node) -> tuple:
    """(is_lstm, x, states, reset, weights, layers, batch_first) of qlower::lstm/gru or aten's
    lstm.input/gru.input; None for variants without an ONNX form (bidirectional, training,
    no biases)."""
    t, a = node.target, node.args
    if t in (q.lstm.default, q.gru.default):
        is_lstm = t is q.lstm.default
        states = [a[1], a[2]] if is_lstm else [a[1]]
        return (is_lstm, a[0], states, a[len(states) + 1]) + tuple(a[len(states) + 2:])
    x, hx, weights, biases, layers, _dropout, train, bidirectional, batch_first = a
    if not biases or train or bidirectional:
        return None
    states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
    return t is aten.lstm.input, x, states, None, weights, layers, batch_first


def _rnn_body(e: Emitter, node: Node) -> list[str] | None:
    parsed = rnn_args(node)
    if parsed is None:
        return None
    is_lstm, x, state_nodes, reset, weights, layers, batch_first = parsed
    values = [e.value(w) for w in weights]
    if x.meta["val"].dim() != 3 or any(v is None for v in values) or len(values) != 4 * layers:
        return None
    order, hidden = (_LSTM_GATES if is_lstm else _GRU_GATES), state_nodes[0].meta["val"].shape[-1]
    if reset is None:
        states = [s.name for s in state_nodes]
    else:
        keep = _keep_flag(e, reset.name)
        states = [e.op("Mul", [s.name, keep]) for s in state_nodes]
    seq = e.op("Transpose", [x.name], perm=[1, 0, 2]) if batch_first else x.name
    finals: list[list[str]] = [[] for _ in states]
    for layer in range(layers):
        w_ih, w_hh, b_ih, b_hh = values[4 * layer:4 * layer + 4]
        inputs = [seq, e.const(_gates(w_ih, order)[None], "W"), e.const(_gates(w_hh, order)[None], "R"),
                  e.const(torch.cat([_gates(b_ih, order), _gates(b_hh, order)])[None], "B"), ""]
        inputs += [_slice(e, s, layer, layer + 1, 0) for s in states] if layers > 1 else states
        outs = [e.fresh("Y")] + [e.fresh("Y_state") for _ in states]
        attrs = {"hidden_size": int(hidden)} if is_lstm else {"hidden_size": int(hidden), "linear_before_reset": 1}
        e.nodes.append(helper.make_node("LSTM" if is_lstm else "GRU", inputs, outs, **attrs))
        seq = e.op("Squeeze", [outs[0], _i64(e, [1], "axes")])   # [S, 1, B, H] -> [S, B, H]
        for f, o in zip(finals, outs[1:]):
            f.append(o)
    y = e.op("Transpose", [seq], perm=[1, 0, 2]) if batch_first else e.op("Identity", [seq])
    return [y] + [e.op("Concat", f, axis=0) if len(f) > 1 else e.op("Identity", f) for f in finals]


STANDARD: dict[object, Callable[[Emitter, Node], bool]] = {
    q.layer_norm.default: _layer_norm,
    q.rms_norm.default: _rms_norm,
    q.group_norm.default: _group_norm,
    q.attention.default: _attention,
    aten.scaled_dot_product_attention.default: _attention,
}
BODIES: dict[object, Callable[[Emitter, Node], list[str] | None]] = {
    q.skip_layer_norm.default: _skip_layer_norm_body,
    q.group_norm.default: _group_norm_silu_body,
    q.masked_softmax.default: _masked_softmax_body,
    q.rotary_embedding.default: _rotary_body,
    q.kv_cache_update.default: _kv_cache_update_body,
    q.stream_buffer.default: _stream_buffer_body,
    q.lstm.default: _rnn_body,
    q.gru.default: _rnn_body,
    aten.lstm.input: _rnn_body,
    aten.gru.input: _rnn_body,
}


# ATen ops that are block ops in all but name (emitted the same way)
BLOCK_LIKE_ATEN = (aten.scaled_dot_product_attention.default, aten.lstm.input, aten.gru.input)


def emit_block_op(e: Emitter, node: Node) -> bool:
    """Emit node as one ONNX node; False when this op / variant has no ONNX form here."""
    standard = STANDARD.get(node.target)
    if standard is not None and standard(e, node):
        return True
    body = BODIES.get(node.target)
    return body is not None and _emit_function_node(e, node, body)
