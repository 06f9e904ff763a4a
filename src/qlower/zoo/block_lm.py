"""A small decoder-only language model built from block ops: RMSNorm, grouped-query Attention,
RotaryEmbedding and a KVCache that lives in module buffers. One call = one decoding step."""
from __future__ import annotations

import torch
from torch import nn

from ..blockops import Attention, KVCache, RMSNorm, RotaryEmbedding


class BlockDecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, max_len: int, batch: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.rope = RotaryEmbedding(self.head_dim, max_len)
        self.cache = KVCache(batch, kv_heads, max_len, self.head_dim)
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.SiLU(), nn.Linear(2 * dim, dim))
        self.max_len = max_len

    def forward(self, x, position):
        b, s, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).reshape(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).reshape(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.rope(q, position), self.rope(k, position)
        keys, values = self.cache(k, v, position)
        # Causal over the cache: query i (at slot position + i) attends to slots 0 .. position + i.
        slots = torch.arange(self.max_len)
        mask = torch.where(slots[None, :] <= position + torch.arange(s)[:, None], 0.0, float("-inf"))
        mask = mask.reshape(1, 1, s, self.max_len)
        y = self.attn(q, keys, values, mask).transpose(1, 2).reshape(b, s, -1)
        x = x + self.o(y)
        return x + self.mlp(self.norm2(x))


class BlockDecoderLM(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, kv_heads: int = 2, layers: int = 2,
                 max_len: int = 32, batch: int = 1):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(BlockDecoderLayer(dim, heads, kv_heads, max_len, batch) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, token, position):
        """token [B, S] int64 (S = 1: a decoding step), position 0-d int64 (the cache slot of the
        first token) -> logits [B, S, vocab]; caches updated."""
        x = self.embed(token)
        for layer in self.layers:
            x = layer(x, position)
        return self.head(self.norm(x))

    def reset(self):
        for layer in self.layers:
            layer.cache.reset()
