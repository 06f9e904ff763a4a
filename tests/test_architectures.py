"""Evaluator-style sweep over transformers architectures qlower was not built around (slow).

Each model is built from a small config with seeded random weights (no downloads), called the way
a user calls it (token ids + attention mask, or pixels), and compiled with batch and sequence
dynamic, fp32 and int8, on every installed engine. What a user would check first: one cluster
where the engine allows it, outputs right at sizes other than the compiled one, a save/load
round trip. What this sweep guards against: a silent wrong answer and
run failures on IREE (a float view imported alone fixed a dynamic dim), IREE int8 clusters
lost to `cumsum` and attention (TMTensor ops), `&`/`new_ones(bool)` fallbacks, slices and splits
of int8 tensors refused on IREE, LLaMA-family ONNX export refused (metadata asserts left inside
grad-mode regions) and a capture error with no suggestion (MobileBERT's `seq != 2` guard).

    .venv/bin/python -m pytest tests/test_architectures.py -m slow          # ~15 min on 2 cores

docs/architectures.md keeps the per-model table this measures.
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import qlower  # noqa: E402

pytestmark = pytest.mark.slow

_H = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=1000,
          max_position_embeddings=128)


def _text(cls, cfg, **kw):
    return lambda: getattr(transformers, cls)(getattr(transformers, cfg)(**{**_H, **kw}))


TEXT = {
    "bert": _text("BertModel", "BertConfig"),
    "distilbert": lambda: transformers.DistilBertModel(transformers.DistilBertConfig(
        dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=1000, max_position_embeddings=128)),
    "roberta": _text("RobertaModel", "RobertaConfig"),
    "albert": _text("AlbertModel", "AlbertConfig", embedding_size=32),
    "electra": _text("ElectraModel", "ElectraConfig", embedding_size=32),
    "mpnet": _text("MPNetModel", "MPNetConfig"),
    "deberta-v2": _text("DebertaV2Model", "DebertaV2Config"),
    "gpt2": lambda: transformers.GPT2Model(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000,
                                                                   n_positions=128)),
    "gpt-neox": _text("GPTNeoXModel", "GPTNeoXConfig"),
    "opt": lambda: transformers.OPTModel(transformers.OPTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128, vocab_size=1000,
        max_position_embeddings=128, word_embed_proj_dim=64)),
    "llama": _text("LlamaModel", "LlamaConfig", num_key_value_heads=2),
    "mistral": _text("MistralModel", "MistralConfig", num_key_value_heads=2),
    "qwen2": _text("Qwen2Model", "Qwen2Config", num_key_value_heads=2),
    "qwen3": _text("Qwen3Model", "Qwen3Config", num_key_value_heads=2, head_dim=16),
    "phi": _text("PhiModel", "PhiConfig"),
    "gemma": _text("GemmaModel", "GemmaConfig", num_key_value_heads=2, head_dim=16),
    "bloom": lambda: transformers.BloomModel(transformers.BloomConfig(hidden_size=64, n_layer=2, n_head=4,
                                                                      vocab_size=1000)),
    "falcon": _text("FalconModel", "FalconConfig"),
    "t5-encoder": lambda: transformers.T5EncoderModel(transformers.T5Config(
        d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=1000)),
    "clip-text": _text("CLIPTextModel", "CLIPTextConfig"),
}
VISION = {
    "vit": lambda: transformers.ViTModel(transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
        patch_size=8)),
    "convnext": lambda: transformers.ConvNextModel(transformers.ConvNextConfig(
        hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1])),
    "swin": lambda: transformers.SwinModel(transformers.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4)),
    "resnet": lambda: transformers.ResNetModel(transformers.ResNetConfig(hidden_sizes=[16, 32], depths=[1, 1],
                                                                         embedding_size=16)),
}


class _Text(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


class _Vision(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixels):
        return self.model(pixel_values=pixels).last_hidden_state


def _tokens(seed: int, batch: int, seq: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (batch, seq), generator=g)
    lengths = torch.randint(max(1, seq // 2), seq + 1, (batch,), generator=g)
    return ids, (torch.arange(seq)[None] < lengths[:, None]).to(torch.int64)


def _pixels(seed: int, batch: int) -> tuple:
    return (torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed)),)


def _setup(name: str):
    """(model, example, dynamic_shapes, calibration, test inputs at other sizes)."""
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=16)
    if name in VISION:
        return (_Vision(VISION[name]().eval()), _pixels(0, 2), ({0: batch},),
                [_pixels(10 + i, 2) for i in range(3)], [_pixels(5, 1), _pixels(6, 3)])
    seq = torch.export.Dim("seq", min=2, max=64)
    return (_Text(TEXT[name]().eval()), _tokens(0, 2, 16), ({0: batch, 1: seq}, {0: batch, 1: seq}),
            [_tokens(10 + i, 2, 16) for i in range(3)], [_tokens(5, 1, 7), _tokens(6, 3, 24)])


def _sqnr(ref: torch.Tensor, got: torch.Tensor) -> float:
    return float(10 * torch.log10((ref ** 2).sum() / ((ref - got) ** 2).sum().clamp_min(1e-30)))


_ARCHS = sorted(TEXT) + sorted(VISION)
# int8 SQNR floor vs eager (random weights: a sanity bound that a broken lowering falls far below).
# ConvNeXt measured 20.3 dB at batch 3 on onnxruntime, IREE and the reference backend (bit-equal:
# quantization, not a lowering): its 32x32 input leaves a 64-value output, and its residual
# branches are scaled by layer-scale 1e-6 before the per-tensor quantized add.
_INT8_FLOOR_DB = {"convnext": 18.0}


@pytest.mark.parametrize("quantize", [None, "int8"])
@pytest.mark.parametrize("name", _ARCHS)
def test_onnxruntime_one_cluster_and_right_at_every_size(name, quantize, tmp_path):
    """The default engine: one cluster, no fallback, fp32 within float tolerance of eager and int8
    above 25 dB at two sizes the compile never saw; save/load bit-exact; the exported ONNX graph
    runs alone."""
    model, example, dynamic, calibration, tests = _setup(name)
    cm = qlower.compile(model, example, quantize=quantize, calibration=calibration if quantize else None,
                        backend="onnxruntime", dynamic_shapes=dynamic)
    report = cm.report()
    assert len(report.compiled) == 1 and not report.fallbacks, str(report)
    loaded = qlower.load(cm.save(tmp_path / "m.pt2"))
    with torch.no_grad():
        for x in tests:
            want, got = model(*x), cm(*x)
            if quantize is None:
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            else:
                assert _sqnr(want, got) > _INT8_FLOOR_DB.get(name, 25.0)
            assert torch.equal(loaded(*x), got)
    qlower.export(cm, tmp_path / "m.onnx", format="onnx")


@pytest.mark.parametrize("quantize", [None, "int8"])
@pytest.mark.parametrize("name", _ARCHS)
def test_iree_no_failed_cluster_and_bit_exact_in_the_fixed_profile(name, quantize):
    """IREE: one cluster set with no PyTorch fallback (every cluster the capability accepted
    compiles and runs at every size: no "compile failed" / "run failed"), fp32 within float
    tolerance of eager, int8 equal to the
    reference backend in the fixed profile up to float-kernel rounding (the programs end in a
    float LayerNorm/RMSNorm: within 1e-3 of it and above 25 dB vs eager)."""
    pytest.importorskip("iree.compiler")
    model, example, dynamic, calibration, tests = _setup(name)
    if quantize is None:
        cm = qlower.compile(model, example, backend="iree", dynamic_shapes=dynamic)
    else:
        program = qlower.quantize(model, example, calibration, dynamic_shapes=dynamic, backend="iree")
        cm = qlower.compile(program, example, backend="iree", profile="fixed", dynamic_shapes=dynamic)
        ref = qlower.compile(program, example, backend="reference", profile="fixed", dynamic_shapes=dynamic)
    with torch.no_grad():
        for x in tests:
            got = cm(*x)
            if quantize is None:
                torch.testing.assert_close(got, model(*x), rtol=1e-4, atol=1e-4)
            else:
                assert _sqnr(model(*x), got) > _INT8_FLOOR_DB.get(name, 25.0)
                torch.testing.assert_close(got, ref(*x), rtol=0, atol=1e-3)
    failed = [c for c in cm.report().clusters if "failed" in (c.reason or "")]
    assert not failed, failed
    assert not cm.report().fallbacks, [(c.ops, c.reason) for c in cm.report().fallbacks]   # no fallbacks
