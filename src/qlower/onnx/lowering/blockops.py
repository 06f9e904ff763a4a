"""ONNX translations of the block ops: each block op becomes ONE ONNX node.

- The standard op where ONNX has one with the same semantics (opset 23):
  layer_norm -> LayerNormalization, rms_norm -> RMSNormalization,
  attention -> Attention (grouped-query heads, causal, float or boolean masks, symbolic shapes).
- Otherwise a node in the custom domain `qlower` whose FunctionProto body (an onnxscript
  function, variants as attributes) is the op's decomposition in standard ONNX, so any ONNX
  runtime can run it (ONNX Runtime inlines it when the session loads): skip_layer_norm,
  group_norm (`group_norm_silu` with SiLU; two-pass statistics, not GroupNormalization: see
  functions.py), masked_softmax (`masked_softmax_lengths` in lengths
  mode), rotary_embedding (`rotary_embedding_interleaved`), kv_cache_update, stream_buffer
  (bodies in functions.py).
- lstm / gru: ONNX LSTM / GRU nodes, one per layer, gates reordered from PyTorch's (i, f, g, o) /
  (r, z, n) to ONNX's (i, o, f, c) / (z, r, h), with `reset` zeroing the incoming state.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
from torch.fx import Node

from ...fx import full_args
from ...partition import holds_empty_tensor
from . import functions as fn
from .table import lowers
from .onnx_ops import const, first_output, i64, op, value_of

q = torch.ops.qlower
_INT64_MAX = np.iinfo(np.int64).max


# ------------------------------------------------------------------------------ capability
def _no_dropout_attention(node: Node) -> str | None:
    """non-empty query/key/value (ONNX Runtime's Attention rejects batch 0 at run time)"""
    if holds_empty_tensor(node):
        return "attention on an empty tensor (ONNX Runtime's Attention rejects batch 0 at run time)"
    return None


def _static_head_dim(node: Node) -> str | None:
    """static head dimension"""
    return None if isinstance(node.args[0].meta["val"].shape[-1], int) else "symbolic head dimension"


def _rnn_constant_weights(node: Node) -> str | None:
    """batched 3-D input, constant weights with biases"""
    a = full_args(node)
    x, weights, layers = a[0], a[-3], a[-2]
    if x.meta["val"].dim() != 3:
        return "unbatched input"
    if len(weights) != 4 * layers or any(getattr(w, "op", None) != "get_attr" for w in weights):
        return "recurrent weights must be constant tensors with biases"
    return None


# ------------------------------------------------------------------------------ translations
def _affine(w, b, size: int):
    return (w if w is not None else const(np.ones(size), np.float32),
            b if b is not None else const(np.zeros(size), np.float32))


@lowers(q.layer_norm.default)
def translate_layer_norm(x, normalized_shape: Sequence[int], weight=None, bias=None, eps: float = 1e-5):
    w, b = _affine(weight, bias, int(np.prod(normalized_shape)))
    return first_output(op.LayerNormalization(x, w, b, axis=-len(normalized_shape), epsilon=eps))


@lowers(q.rms_norm.default)
def translate_rms_norm(x, normalized_shape: Sequence[int], weight=None, eps: Optional[float] = None):
    w = weight if weight is not None else const(np.ones(list(normalized_shape)), np.float32)
    eps = float(np.finfo(np.float32).eps) if eps is None else eps
    return first_output(op.RMSNormalization(x, w, axis=-len(normalized_shape), epsilon=eps))


@lowers(q.skip_layer_norm.default)
def translate_skip_layer_norm(x, skip, normalized_shape: Sequence[int], weight=None, bias=None, eps: float = 1e-5):
    w, b = _affine(weight, bias, int(np.prod(normalized_shape)))
    return fn.skip_layer_norm(x, skip, w, b, axis=-len(normalized_shape), epsilon=eps)


@lowers(q.group_norm.default)
def translate_group_norm(x, num_groups: int, weight=None, bias=None, eps: float = 1e-5, silu: bool = False):
    w, b = _affine(weight, bias, x.shape[1])
    body = fn.group_norm_silu if silu else fn.group_norm   # why not GroupNormalization: functions.py
    return body(x, w, b, num_groups=num_groups, epsilon=eps, spatial=list(range(2, len(x.shape))))


@lowers(q.masked_softmax.default)
def translate_masked_softmax(scores, mask=None, lengths=None, dim: int = -1):
    if lengths is None:
        if mask is None:
            # neither mask nor lengths: the function's Add needs an operand (an omitted one was
            # an empty input name, rejected by ONNX Runtime: tests/test_fuzz.py::
            # test_regression_masked_softmax_without_mask); + 0.0 leaves softmax's result unchanged
            mask = const(0.0, np.float32)
        return fn.masked_softmax(scores, mask, axis=dim)
    rank, lrank = len(scores.shape), len(lengths.shape)
    lens = op.Unsqueeze(lengths, i64(list(range(lrank, rank)))) if rank > lrank else lengths
    if mask is not None:
        scores = op.Add(scores, mask)
    return fn.masked_softmax_lengths(scores, lens, axis=dim)


@lowers(q.rotary_embedding.default, when=_static_head_dim)
def translate_rotary_embedding(x, cos, sin, interleaved: bool):
    return fn.rotary_embedding_interleaved(x, cos, sin) if interleaved else fn.rotary_embedding(x, cos, sin)


@lowers(q.kv_cache_update.default)
def translate_kv_cache_update(cache, new, position):
    return fn.kv_cache_update(cache, new, position)


@lowers(q.stream_buffer.default)
def translate_stream_buffer(state, frame, reset):
    return fn.stream_buffer(state, frame, reset)


def _mask_rows_expanded(mask, qv, kv):
    """ONNX Runtime wants the mask's query dimension spelled out (no broadcast there)."""
    if len(mask.shape) >= 2 and mask.shape[-2] == qv.shape[-2]:
        return mask
    rows, cols = op.Shape(qv, start=-2, end=-1), op.Shape(kv, start=-2, end=-1)
    target = op.Concat(op.Shape(mask, end=-2), rows, cols, axis=0) if len(mask.shape) >= 2 \
        else op.Concat(rows, cols, axis=0)
    return op.Expand(mask, target)


@lowers(q.attention.default, when=_no_dropout_attention)
def translate_attention(qv, kv, vv, mask=None, causal: bool = False, scale: Optional[float] = None):
    attrs = {"is_causal": int(causal)}
    if scale is not None:
        attrs["scale"] = scale
    inputs = [qv, kv, vv] + ([_mask_rows_expanded(mask, qv, kv)] if mask is not None else [])
    return first_output(op.Attention(*inputs, **attrs))


# ------------------------------------------------------------------------------ recurrent layers
_LSTM_GATES = [0, 3, 1, 2]   # PyTorch (i, f, g, o) -> ONNX (i, o, f, c)
_GRU_GATES = [1, 0, 2]       # PyTorch (r, z, n)    -> ONNX (z, r, h)


def _gates(t: np.ndarray, order: list[int]) -> np.ndarray:
    return np.concatenate([np.split(t, len(order))[i] for i in order])


def _rnn(x, states: list, reset, weights, num_layers: int, batch_first: bool, is_lstm: bool):
    values = [value_of(w) for w in weights]
    order, hidden = (_LSTM_GATES if is_lstm else _GRU_GATES), states[0].shape[-1]
    if reset is not None:
        keep = op.Cast(op.Not(op.Reshape(reset, i64([]))), to=1)
        states = [op.Mul(s, keep) for s in states]
    seq = op.Transpose(x, perm=[1, 0, 2]) if batch_first else x
    finals: list[list] = [[] for _ in states]
    for layer in range(num_layers):
        w_ih, w_hh, b_ih, b_hh = values[4 * layer:4 * layer + 4]
        inputs = [seq, const(_gates(w_ih, order)[None], np.float32), const(_gates(w_hh, order)[None], np.float32),
                  const(np.concatenate([_gates(b_ih, order), _gates(b_hh, order)])[None], np.float32), None]
        inputs += [op.Slice(s, i64([layer]), i64([layer + 1]), i64([0])) for s in states] if num_layers > 1 \
            else states
        attrs = {"hidden_size": int(hidden)} if is_lstm else {"hidden_size": int(hidden), "linear_before_reset": 1}
        outs = op.LSTM(*inputs, **attrs) if is_lstm else op.GRU(*inputs, **attrs)
        seq = op.Squeeze(outs[0], i64([1]))   # [S, 1, B, H] -> [S, B, H]
        for f, o in zip(finals, outs[1:]):
            f.append(o)
    y = op.Transpose(seq, perm=[1, 0, 2]) if batch_first else seq
    return (y, *[op.Concat(*f, axis=0) if len(f) > 1 else f[0] for f in finals])


@lowers(q.lstm.default, when=_rnn_constant_weights)
def translate_lstm(x, h, c, reset, weights, num_layers: int, batch_first: bool):
    return _rnn(x, [h, c], reset, weights, num_layers, batch_first, is_lstm=True)


@lowers(q.gru.default, when=_rnn_constant_weights)
def translate_gru(x, h, reset, weights, num_layers: int, batch_first: bool):
    return _rnn(x, [h], reset, weights, num_layers, batch_first, is_lstm=False)
