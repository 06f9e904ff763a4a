"""Block ops: `torch.library` custom ops in namespace `qlower`, opaque to torch.export (one node
each). Every op has
- a reference kernel that calls PyTorch's own functional, so swapping a PyTorch module for the
  block op (`replace`) gives identical outputs;
- a fake kernel (shapes, symbolic dims);
- a decomposition into core ATen ops (`DECOMPOSITIONS`), used when a backend lacks the op;
- an autograd formula (through the decomposition) where training makes sense.
Stateful ops are functional here (state in, new state out); their nn.Module wrappers keep the
state in buffers and update it in place, which torch.export records as a buffer mutation.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F

NS = "qlower"
DECOMPOSITIONS: dict[object, Callable] = {}


def _register(op, decomposition: Callable, differentiable: bool = True):
    """Attach the decomposition, and an autograd formula computed through it."""
    DECOMPOSITIONS[op._opoverload] = decomposition
    if not differentiable:
        return

    def setup_context(ctx, inputs, output):
        ctx.inputs = inputs

    def backward(ctx, *grads):
        tensors = [i for i, a in enumerate(ctx.inputs) if isinstance(a, torch.Tensor) and a.is_floating_point()]

        def f(*ts):
            args = list(ctx.inputs)
            for i, t in zip(tensors, ts):
                args[i] = t
            return decomposition(*args)
        with torch.enable_grad():
            _, vjp = torch.func.vjp(f, *[ctx.inputs[i] for i in tensors])
            grad_in = vjp(grads[0] if len(grads) == 1 else grads)
        out = [None] * len(ctx.inputs)
        for i, g in zip(tensors, grad_in):
            out[i] = g
        return tuple(out)
    op.register_autograd(backward, setup_context=setup_context)


def _dims(normalized_shape) -> list[int]:
    return list(range(-len(normalized_shape), 0))


# ------------------------------------------------------------------------------ norms
@torch.library.custom_op(f"{NS}::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, normalized_shape: list[int], weight: Optional[torch.Tensor],
             eps: Optional[float]) -> torch.Tensor:
    return F.rms_norm(x, normalized_shape, weight, eps)


def rms_norm_decomposed(x, normalized_shape, weight, eps):
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    y = x * torch.rsqrt(x.pow(2).mean(_dims(normalized_shape), keepdim=True) + eps)
    return y * weight if weight is not None else y


@rms_norm.register_fake
def _(x, normalized_shape, weight, eps):
    return torch.empty_like(x)


@torch.library.custom_op(f"{NS}::layer_norm", mutates_args=())
def layer_norm(x: torch.Tensor, normalized_shape: list[int], weight: Optional[torch.Tensor],
               bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


def layer_norm_decomposed(x, normalized_shape, weight, bias, eps):
    dims = _dims(normalized_shape)
    mean = x.mean(dims, keepdim=True)
    var = (x - mean).pow(2).mean(dims, keepdim=True)
    y = (x - mean) * torch.rsqrt(var + eps)
    y = y * weight if weight is not None else y
    return y + bias if bias is not None else y


@layer_norm.register_fake
def _(x, normalized_shape, weight, bias, eps):
    return torch.empty_like(x)


@torch.library.custom_op(f"{NS}::skip_layer_norm", mutates_args=())
def skip_layer_norm(x: torch.Tensor, skip: torch.Tensor, normalized_shape: list[int],
                    weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    return F.layer_norm(x + skip, normalized_shape, weight, bias, eps)


def skip_layer_norm_decomposed(x, skip, normalized_shape, weight, bias, eps):
    return layer_norm_decomposed(x + skip, normalized_shape, weight, bias, eps)


@skip_layer_norm.register_fake
def _(x, skip, normalized_shape, weight, bias, eps):
    return torch.empty(torch.broadcast_shapes(x.shape, skip.shape), dtype=x.dtype, device=x.device)


@torch.library.custom_op(f"{NS}::group_norm", mutates_args=())
def group_norm(x: torch.Tensor, groups: int, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
               eps: float, silu: bool) -> torch.Tensor:
    y = F.group_norm(x, groups, weight, bias, eps)
    return F.silu(y) if silu else y


def group_norm_decomposed(x, groups, weight, bias, eps, silu):
    n, c = x.shape[0], x.shape[1]
    # sizes spelled out: `reshape(n, groups, -1)` is ambiguous on an empty batch (found by
    # running the fuzz grammar's programs on batch 0: a raw RuntimeError from OpenVINO's compile)
    g = x.reshape(n, groups, (c // groups) * math.prod(x.shape[2:]))
    mean = g.mean(-1, keepdim=True)
    var = (g - mean).pow(2).mean(-1, keepdim=True)
    y = ((g - mean) * torch.rsqrt(var + eps)).reshape(x.shape)
    affine = [1, c] + [1] * (x.dim() - 2)
    if weight is not None:
        y = y * weight.reshape(affine)
    if bias is not None:
        y = y + bias.reshape(affine)
    return y * torch.sigmoid(y) if silu else y


@group_norm.register_fake
def _(x, groups, weight, bias, eps, silu):
    return torch.empty_like(x)


# ------------------------------------------------------------------------------ attention
@torch.library.custom_op(f"{NS}::masked_softmax", mutates_args=())
def masked_softmax(scores: torch.Tensor, mask: Optional[torch.Tensor], lengths: Optional[torch.Tensor],
                   dim: int) -> torch.Tensor:
    return masked_softmax_decomposed(scores, mask, lengths, dim)


def masked_softmax_decomposed(scores, mask, lengths, dim):
    """Additive `mask` (broadcast to scores), and/or `lengths` ("compressed" mode: positions
    >= length along the last dim get probability 0). Fully masked rows give zeros, not NaN."""
    if mask is not None:
        scores = scores + mask
    if lengths is not None:
        positions = torch.arange(scores.shape[-1], device=scores.device)
        keep = positions < lengths.reshape(*lengths.shape, *([1] * (scores.dim() - lengths.dim())))
        scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=dim)
    return torch.nan_to_num(probs, nan=0.0)


@masked_softmax.register_fake
def _(scores, mask, lengths, dim):
    return torch.empty_like(scores)


@torch.library.custom_op(f"{NS}::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], causal: bool,
              scale: Optional[float]) -> torch.Tensor:
    """Scaled dot-product attention on [B, H, S, D]; k/v may have fewer heads (grouped-query)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


def attention_decomposed(q, k, v, mask, causal, scale):
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        # top-left aligned, as F.scaled_dot_product_attention (query i sees keys 0..i)
        allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return torch.matmul(torch.softmax(scores, dim=-1), v)


@attention.register_fake
def _(q, k, v, mask, causal, scale):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@torch.library.custom_op(f"{NS}::rotary_embedding", mutates_args=())
def rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    return rotary_embedding_decomposed(x, cos, sin, interleaved)


def rotary_embedding_decomposed(x, cos, sin, interleaved):
    """x * cos + rotate(x) * sin; rotate is the half-split (GPT-NeoX/LLaMA) or interleaved (GPT-J)
    pairing. cos/sin broadcast against x ([S, D] or [B, 1, S, D])."""
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((-x2, x1), dim=-1).flatten(-2)
    else:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@rotary_embedding.register_fake
def _(x, cos, sin, interleaved):
    return torch.empty_like(x)


# ------------------------------------------------------------------------------ state
@torch.library.custom_op(f"{NS}::kv_cache_update", mutates_args=())
def kv_cache_update(cache: torch.Tensor, new: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """The cache [B, H, T, D] with `new` [B, H, S, D] written at time index `position` (a 0-d
    int64 tensor)."""
    return kv_cache_update_decomposed(cache, new, position)


def kv_cache_update_decomposed(cache, new, position):
    index = position.reshape(()) + torch.arange(new.shape[2], device=cache.device)
    return cache.index_copy(2, index, new)


@kv_cache_update.register_fake
def _(cache, new, position):
    return torch.empty_like(cache)


@torch.library.custom_op(f"{NS}::lstm", mutates_args=())
def lstm(x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, reset: torch.Tensor, weights: list[torch.Tensor],
         num_layers: int, batch_first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """nn.LSTM semantics (biases present, unidirectional) with state in/out; where `reset` is
    true the incoming state is zeroed first."""
    keep = (~reset.reshape(())).to(h.dtype)
    y, h2, c2 = torch.ops.aten.lstm.input(x, (h * keep, c * keep), weights, True, num_layers, 0.0, False, False,
                                          batch_first)
    return y, h2, c2


@lstm.register_fake
def _(x, h, c, reset, weights, num_layers, batch_first):
    shape = list(x.shape)
    shape[-1] = h.shape[-1]
    return x.new_empty(shape), torch.empty_like(h), torch.empty_like(c)


@torch.library.custom_op(f"{NS}::gru", mutates_args=())
def gru(x: torch.Tensor, h: torch.Tensor, reset: torch.Tensor, weights: list[torch.Tensor], num_layers: int,
        batch_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    keep = (~reset.reshape(())).to(h.dtype)
    y, h2 = torch.ops.aten.gru.input(x, h * keep, weights, True, num_layers, 0.0, False, False, batch_first)
    return y, h2


@gru.register_fake
def _(x, h, reset, weights, num_layers, batch_first):
    shape = list(x.shape)
    shape[-1] = h.shape[-1]
    return x.new_empty(shape), torch.empty_like(h)


@torch.library.custom_op(f"{NS}::stream_buffer", mutates_args=())
def stream_buffer(state: torch.Tensor, frame: torch.Tensor, reset: torch.Tensor) -> torch.Tensor:
    """Sliding window over time (dim 1): drop the oldest frame.shape[1] steps of `state`, append
    `frame`; where `reset` is true the window restarts from zeros."""
    return stream_buffer_decomposed(state, frame, reset)


def stream_buffer_decomposed(state, frame, reset):
    state = state * (~reset.reshape(())).to(state.dtype)
    return torch.cat([state[:, frame.shape[1]:], frame], dim=1)


@stream_buffer.register_fake
def _(state, frame, reset):
    return torch.empty_like(state)


_register(rms_norm, rms_norm_decomposed)
_register(layer_norm, layer_norm_decomposed)
_register(skip_layer_norm, skip_layer_norm_decomposed)
_register(group_norm, group_norm_decomposed)
_register(masked_softmax, masked_softmax_decomposed)
_register(attention, attention_decomposed)
_register(rotary_embedding, rotary_embedding_decomposed)
_register(kv_cache_update, kv_cache_update_decomposed, differentiable=False)
_register(stream_buffer, stream_buffer_decomposed, differentiable=False)

BLOCK_OPS = {op._opoverload: op for op in (rms_norm, layer_norm, skip_layer_norm, group_norm, masked_softmax,
                                           attention, rotary_embedding, kv_cache_update, lstm, gru, stream_buffer)}
