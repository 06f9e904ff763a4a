"""nn.Module wrappers of the block ops. Parameter and buffer names match the PyTorch modules they
replace, so state_dicts load either way. Stateful modules keep their state in buffers and update
it in place on every call (torch.export records that as a buffer mutation)."""
from __future__ import annotations


import torch
from torch import nn
import torch.nn.functional as F

from . import ops

_FALSE = torch.tensor(False)


def _reset_flag(reset) -> torch.Tensor:
    if reset is None:
        return _FALSE
    return torch.as_tensor(reset, dtype=torch.bool).reshape(())


class RMSNorm(nn.RMSNorm):
    def forward(self, x):
        return ops.rms_norm(x, list(self.normalized_shape), self.weight, self.eps)


class LayerNorm(nn.LayerNorm):
    def forward(self, x):
        return ops.layer_norm(x, list(self.normalized_shape), self.weight, self.bias, self.eps)


class SkipLayerNorm(nn.LayerNorm):
    """LayerNorm(x + skip): the residual add and the norm as one op."""

    def forward(self, x, skip):
        return ops.skip_layer_norm(x, skip, list(self.normalized_shape), self.weight, self.bias, self.eps)


class GroupNorm(nn.GroupNorm):
    """nn.GroupNorm, optionally fused with a following SiLU (`silu=True`)."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, silu: bool = False, **kw):
        super().__init__(num_groups, num_channels, eps, affine, **kw)
        self.silu = silu

    def forward(self, x):
        return ops.group_norm(x, self.num_groups, self.weight, self.bias, self.eps, self.silu)


class MaskedSoftmax(nn.Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, scores, mask=None, lengths=None):
        return ops.masked_softmax(scores, mask, lengths, self.dim)


class Attention(nn.Module):
    """Scaled dot-product attention on [B, H, S, D] (k/v may have fewer heads: GQA)."""

    def __init__(self, causal: bool = False, scale: float | None = None):
        super().__init__()
        self.causal, self.scale = causal, scale

    def forward(self, q, k, v, mask=None):
        return ops.attention(q, k, v, mask, self.causal, self.scale)


class MultiheadAttention(nn.MultiheadAttention):
    """nn.MultiheadAttention (packed in-projection, same parameters) whose core is one attention
    block op. Supports attn_mask / key_padding_mask; returns (output, None)."""

    def forward(self, query, key, value, key_padding_mask=None, need_weights=False, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        b, s, e = query.shape
        h, d = self.num_heads, self.head_dim
        w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        b_q, b_k, b_v = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None, None, None)
        q = F.linear(query, w_q, b_q).reshape(b, s, h, d).transpose(1, 2)
        k = F.linear(key, w_k, b_k).reshape(b, key.shape[1], h, d).transpose(1, 2)
        v = F.linear(value, w_v, b_v).reshape(b, value.shape[1], h, d).transpose(1, 2)
        mask = _merge_masks(attn_mask, key_padding_mask, q.dtype)
        y = ops.attention(q, k, v, mask, bool(is_causal), None).transpose(1, 2).reshape(b, s, e)
        y = self.out_proj(y)
        return (y if self.batch_first else y.transpose(0, 1)), None


def _merge_masks(attn_mask, key_padding_mask, dtype):
    mask = None
    if attn_mask is not None:
        mask = torch.zeros(attn_mask.shape, dtype=dtype).masked_fill(attn_mask, float("-inf")) \
            if attn_mask.dtype == torch.bool else attn_mask.to(dtype)
    if key_padding_mask is not None:
        kp = key_padding_mask[:, None, None, :]
        kp = (torch.zeros(kp.shape, dtype=dtype).masked_fill(kp, float("-inf")) if kp.dtype == torch.bool
              else kp.to(dtype))
        mask = kp if mask is None else mask + kp
    return mask


class RotaryEmbedding(nn.Module):
    """Rotary position embedding with precomputed cos/sin tables (buffers)."""

    def __init__(self, dim: int, max_positions: int = 2048, base: float = 10000.0, interleaved: bool = False):
        super().__init__()
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)
        if interleaved:
            angles = angles.repeat_interleave(2, dim=-1)
        else:
            angles = torch.cat([angles, angles], dim=-1)
        self.interleaved = interleaved
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x, offset: int | torch.Tensor = 0):
        """x: [B, H, S, D]; positions offset .. offset+S-1."""
        s = x.shape[-2]
        if isinstance(offset, torch.Tensor):
            cos = self.cos.index_select(0, offset.reshape(()) + torch.arange(s))
            sin = self.sin.index_select(0, offset.reshape(()) + torch.arange(s))
        else:
            cos, sin = self.cos[offset:offset + s], self.sin[offset:offset + s]
        return ops.rotary_embedding(x, cos, sin, self.interleaved)


class KVCache(nn.Module):
    """Key/value cache buffers [B, H, T, D]; `forward(k, v, position)` writes the new entries at
    `position` (0-d int64 tensor) in place and returns the full caches."""

    def __init__(self, batch: int, heads: int, max_len: int, head_dim: int):
        super().__init__()
        self.register_buffer("k", torch.zeros(batch, heads, max_len, head_dim))
        self.register_buffer("v", torch.zeros(batch, heads, max_len, head_dim))

    def forward(self, new_k, new_v, position):
        self.k.copy_(ops.kv_cache_update(self.k, new_k, position))
        self.v.copy_(ops.kv_cache_update(self.v, new_v, position))
        return self.k, self.v

    def reset(self):
        self.k.zero_()
        self.v.zero_()


class _StatefulRNN(nn.Module):
    """Owns an nn.LSTM/GRU (same parameter names under `.rnn`) plus state buffers."""

    def _weights(self):
        return [p for p in self.rnn._flat_weights]


class StatefulLSTM(_StatefulRNN):
    """LSTM whose (h, c) state persists across calls in buffers; `reset` (bool) zeroes it first."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, batch: int = 1,
                 batch_first: bool = True):
        super().__init__()
        self.rnn = nn.LSTM(input_size, hidden_size, num_layers, batch_first=batch_first)
        self.register_buffer("h", torch.zeros(num_layers, batch, hidden_size))
        self.register_buffer("c", torch.zeros(num_layers, batch, hidden_size))

    def forward(self, x, reset=None):
        y, h, c = ops.lstm(x, self.h, self.c, _reset_flag(reset), self._weights(), self.rnn.num_layers,
                           self.rnn.batch_first)
        self.h.copy_(h)
        self.c.copy_(c)
        return y


class StatefulGRU(_StatefulRNN):
    """GRU whose state persists across calls in a buffer; `reset` (bool) zeroes it first."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, batch: int = 1,
                 batch_first: bool = True):
        super().__init__()
        self.rnn = nn.GRU(input_size, hidden_size, num_layers, batch_first=batch_first)
        self.register_buffer("h", torch.zeros(num_layers, batch, hidden_size))

    def forward(self, x, reset=None):
        y, h = ops.gru(x, self.h, _reset_flag(reset), self._weights(), self.rnn.num_layers, self.rnn.batch_first)
        self.h.copy_(h)
        return y


class StreamingBuffer(nn.Module):
    """Sliding window [B, window, C] over streamed frames [B, n, C]; `reset` restarts it."""

    def __init__(self, window: int, channels: int, batch: int = 1):
        super().__init__()
        self.register_buffer("state", torch.zeros(batch, window, channels))

    def forward(self, frame, reset=None):
        self.state.copy_(ops.stream_buffer(self.state, frame, _reset_flag(reset)))
        return self.state.clone()


class BlockLSTM(nn.LSTM):
    """nn.LSTM (same call signature and parameters) as one block op; for `replace`."""

    def forward(self, x, hx=None):
        if self.bidirectional or self.proj_size or not self.bias:
            return super().forward(x, hx)
        batch = x.shape[0] if self.batch_first else x.shape[1]
        if hx is None:
            z = x.new_zeros(self.num_layers, batch, self.hidden_size)
            hx = (z, z)
        y, h, c = ops.lstm(x, hx[0], hx[1], _FALSE, list(self._flat_weights), self.num_layers, self.batch_first)
        return y, (h, c)


class BlockGRU(nn.GRU):
    """nn.GRU (same call signature and parameters) as one block op; for `replace`."""

    def forward(self, x, hx=None):
        if self.bidirectional or not self.bias:
            return super().forward(x, hx)
        batch = x.shape[0] if self.batch_first else x.shape[1]
        if hx is None:
            hx = x.new_zeros(self.num_layers, batch, self.hidden_size)
        y, h = ops.gru(x, hx, _FALSE, list(self._flat_weights), self.num_layers, self.batch_first)
        return y, h
