"""Model definitions for the zoo."""
from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNetish(nn.Module):
    def __init__(self, width: int = 16, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.layer1 = BasicBlock(width, width, 1)
        self.layer2 = BasicBlock(width, 2 * width, 2)
        self.layer3 = BasicBlock(2 * width, 4 * width, 2)
        self.fc = nn.Linear(4 * width, classes)
        _randomize_bn(self)

    def forward(self, x):
        x = self.pool(self.stem(x))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(x).reshape(b, s, 3, h, d // h).permute(2, 0, 3, 1, 4).unbind(0)
        att = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h)), dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, s, d)
        x = self.norm1(x + self.proj(y))
        return self.norm2(x + self.fc2(F.gelu(self.fc1(x))))


class TinyEncoder(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 128, layers: int = 2):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, hidden) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _randomize_bn(model: nn.Module) -> None:
    """Give BatchNorms non-trivial statistics so folding them is actually exercised."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.7, 1.3)
                m.bias.uniform_(-0.1, 0.1)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_res else y


class MobileNetV2ish(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
        self.blocks = nn.Sequential(InvertedResidual(16, 16, 1), InvertedResidual(16, 24, 2),
                                    InvertedResidual(24, 24, 1), InvertedResidual(24, 32, 2),
                                    InvertedResidual(32, 32, 1))
        self.head = nn.Linear(32, classes)
        _randomize_bn(self)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class MaskedEncoderLayer(EncoderLayer):
    """EncoderLayer with an additive attention mask [B, 1, 1, S] (0 keep, -1e4 drop)."""

    def forward(self, x, mask=None):
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(x).reshape(b, s, 3, h, d // h).permute(2, 0, 3, 1, 4).unbind(0)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        if mask is not None:
            scores = scores + mask
        y = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, s, d)
        x = self.norm1(x + self.proj(y))
        return self.norm2(x + self.fc2(F.gelu(self.fc1(x))))


class TinyViT(nn.Module):
    def __init__(self, dim: int = 64, patch: int = 8, image: int = 32, layers: int = 2, classes: int = 10):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2, dim) * 0.02)
        self.layers = nn.ModuleList(MaskedEncoderLayer(dim, 4, 2 * dim) for _ in range(layers))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(1))


class TinyBert(nn.Module):
    """Token + position embeddings, LayerNorm, masked encoder layers; inputs (ids, mask 0/1)."""

    def __init__(self, vocab: int = 1000, dim: int = 64, seq: int = 32, layers: int = 2):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(MaskedEncoderLayer(dim, 4, 2 * dim) for _ in range(layers))

    def forward(self, ids, mask):
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.norm(self.tok(ids) + self.pos(positions))
        additive = (1.0 - mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, additive)
        return x


class TinyDecoderStep(nn.Module):
    """One decoding step of a decoder-only LM with a sliding KV cache passed in and out:
    (token [B,1], k_cache, v_cache [L,B,H,T,D]) -> (logits, k_cache', v_cache')."""

    def __init__(self, vocab: int = 1000, dim: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.heads, self.dim = heads, dim
        self.tok = nn.Embedding(vocab, dim)
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
                                 for _ in range(layers))
        self.norm = nn.ModuleList(nn.LayerNorm(dim) for _ in range(2 * layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, token, k_cache, v_cache):
        x = self.tok(token)
        b, h, d = x.shape[0], self.heads, self.dim // self.heads
        new_k, new_v = [], []
        for i, (qkv, proj, mlp) in enumerate(zip(self.qkv, self.proj, self.mlp)):
            q, k, v = qkv(self.norm[2 * i](x)).reshape(b, 1, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
            keys = torch.cat([k_cache[i][:, :, 1:], k], dim=2)
            values = torch.cat([v_cache[i][:, :, 1:], v], dim=2)
            new_k.append(keys)
            new_v.append(values)
            att = torch.softmax(torch.matmul(q, keys.transpose(-2, -1)) * (1.0 / math.sqrt(d)), dim=-1)
            x = x + proj(torch.matmul(att, values).transpose(1, 2).reshape(b, 1, self.dim))
            x = x + mlp(self.norm[2 * i + 1](x))
        return self.head(x), torch.stack(new_k), torch.stack(new_v)


class StreamingLSTM(nn.Module):
    """A keyword-spotting-style streaming model: conv front end, LSTM with state in/out."""

    def __init__(self, feat: int = 40, hidden: int = 64, classes: int = 12):
        super().__init__()
        self.front = nn.Conv1d(feat, hidden, 3, padding=1)
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, frames, h, c):
        x = torch.relu(self.front(frames.transpose(1, 2))).transpose(1, 2)
        y, (h2, c2) = self.lstm(x, (h, c))
        return self.head(y[:, -1]), h2, c2
