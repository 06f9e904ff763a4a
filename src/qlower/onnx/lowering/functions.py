"""FunctionProto bodies of the qlower-domain block ops: onnxscript functions whose Python name is
the ONNX op_type (domain `qlower`), variants as attributes or as separate functions. Each body
is the op's decomposition in standard ONNX, so any runtime can execute the one node."""
from __future__ import annotations

import onnxscript
from onnxscript import FLOAT, INT64

from .onnx_ops import QLOWER, op

@onnxscript.script(QLOWER, default_opset=op)
def skip_layer_norm(x, skip, weight, bias, axis: int, epsilon: float) -> FLOAT:
    return op.LayerNormalization(op.Add(x, skip), weight, bias, axis=axis, epsilon=epsilon)


# group_norm: two-pass statistics over an [N, G, -1] view, spread back per channel and
# broadcast over the spatial axes (`spatial`, given by the translation: a function body does not
# know its input's rank). Not ONNX's GroupNormalization: ONNX Runtime's kernel takes the
# variance as E[x^2] - E[x]^2, which cancels on rows with a large mean and a small spread (fuzz:
# every output NaN for 100 + 1e-4 * randn, where eager is finite). No Reshape back to x's shape:
# onnxscript's optimizer folded Reshape(y, Shape(x)) inside a function body into Reshape(y, []).
@onnxscript.script(QLOWER, default_opset=op)
def group_norm(x, weight, bias, num_groups: int, epsilon: float, spatial: list[int]) -> FLOAT:
    n = op.Shape(x, start=0, end=1)
    groups = op.Reshape(op.Constant(value_int=num_groups), op.Constant(value_ints=[1]))
    grouped = op.Reshape(x, op.Concat(n, groups, op.Constant(value_ints=[-1]), axis=0))
    mean = op.ReduceMean(grouped, op.Constant(value_ints=[2]), keepdims=1)
    centered = op.Sub(grouped, mean)
    var = op.ReduceMean(op.Mul(centered, centered), op.Constant(value_ints=[2]), keepdims=1)
    rstd = op.Reciprocal(op.Sqrt(op.Add(var, op.CastLike(op.Constant(value_float=epsilon), var))))
    per_group = op.Div(op.Shape(x, start=1, end=2), groups)
    spread = op.Concat(n, groups, per_group, axis=0)
    flat = op.Concat(n, op.Constant(value_ints=[-1]), axis=0)
    axes = op.Constant(value_ints=spatial)
    mean_c = op.Unsqueeze(op.Reshape(op.Expand(mean, spread), flat), axes)
    rstd_c = op.Unsqueeze(op.Reshape(op.Expand(rstd, spread), flat), axes)
    channel_axes = op.Sub(axes, op.Constant(value_ints=[1]))
    w = op.Unsqueeze(weight, channel_axes)
    b = op.Unsqueeze(bias, channel_axes)
    return op.Add(op.Mul(op.Mul(op.Sub(x, mean_c), rstd_c), w), b)


@onnxscript.script(QLOWER, default_opset=op)
def group_norm_silu(x, weight, bias, num_groups: int, epsilon: float, spatial: list[int]) -> FLOAT:
    y = group_norm(x, weight, bias, num_groups=num_groups, epsilon=epsilon, spatial=spatial)
    return op.Mul(y, op.Sigmoid(y))


@onnxscript.script(QLOWER, default_opset=op)
def masked_softmax(scores, mask, axis: int) -> FLOAT:
    p = op.Softmax(op.Add(scores, mask), axis=axis)
    return op.Where(op.IsNaN(p), op.CastLike(0.0, p), p)   # fully masked rows -> 0, not NaN


@onnxscript.script(QLOWER, default_opset=op)
def masked_softmax_lengths(scores, lengths, axis: int) -> FLOAT:
    """`lengths` already has scores' rank (trailing 1s): positions >= length get probability 0."""
    n = op.Squeeze(op.Shape(scores, start=-1))
    positions = op.Range(op.Constant(value_int=0), n, op.Constant(value_int=1))
    keep = op.Less(positions, op.Cast(lengths, to=INT64.dtype))
    s = op.Where(keep, scores, op.CastLike(op.Constant(value_float=float("-inf")), scores))
    p = op.Softmax(s, axis=axis)
    return op.Where(op.IsNaN(p), op.CastLike(0.0, p), p)


@onnxscript.script(QLOWER, default_opset=op)
def rotary_embedding(x, cos, sin) -> FLOAT:
    """Half-split rotation: (x1, x2) -> (-x2, x1) over the two halves of the last dim."""
    d = op.Shape(x, start=-1)
    half = op.Div(d, op.Constant(value_ints=[2]))
    last = op.Constant(value_ints=[-1])
    x1 = op.Slice(x, op.Constant(value_ints=[0]), half, last)
    x2 = op.Slice(x, half, d, last)
    rotated = op.Concat(op.Neg(x2), x1, axis=-1)
    return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))


@onnxscript.script(QLOWER, default_opset=op)
def rotary_embedding_interleaved(x, cos, sin) -> FLOAT:
    """Interleaved rotation: pairs (x0, x1) -> (-x1, x0)."""
    d = op.Shape(x, start=-1)
    last = op.Constant(value_ints=[-1])
    two = op.Constant(value_ints=[2])
    even = op.Slice(x, op.Constant(value_ints=[0]), d, last, two)
    odd = op.Slice(x, op.Constant(value_ints=[1]), d, last, two)
    pairs = op.Concat(op.Unsqueeze(op.Neg(odd), last), op.Unsqueeze(even, last), axis=-1)
    rotated = op.Reshape(pairs, op.Shape(x))
    return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))


@onnxscript.script(QLOWER, default_opset=op)
def kv_cache_update(cache, new, position) -> FLOAT:
    start = op.Reshape(op.Cast(position, to=INT64.dtype), op.Constant(value_ints=[1]))
    end = op.Add(start, op.Shape(new, start=2, end=3))
    axis = op.Constant(value_ints=[2])
    before = op.Slice(cache, op.Constant(value_ints=[0]), start, axis)
    after = op.Slice(cache, end, op.Constant(value_ints=[9223372036854775807]), axis)
    return op.Concat(before, new, after, axis=2)


@onnxscript.script(QLOWER, default_opset=op)
def stream_buffer(state, frame, reset) -> FLOAT:
    keep = op.Cast(op.Not(op.Reshape(reset, op.Constant(value_ints=[]))), to=FLOAT.dtype)
    kept = op.Mul(state, keep)
    axis = op.Constant(value_ints=[1])
    tail = op.Slice(kept, op.Shape(frame, start=1, end=2), op.Constant(value_ints=[9223372036854775807]), axis)
    return op.Concat(tail, frame, axis=1)


