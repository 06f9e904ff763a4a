"""HuggingFace transformers models (built from configs, random seeded weights): qlower int8 on
onnxruntime vs fp32, and padding-mask correctness. Skipped only when transformers is absent."""
import pytest
import torch

pytest.importorskip("transformers")

import qlower  # noqa: E402
from qlower.report import cosine  # noqa: E402
from qlower.zoo import hf  # noqa: E402


def inputs(name, seed):
    return hf.image_batch(seed) if name == "vit" else hf.token_batch(seed)


def real_tokens(name, x, out):
    return torch.ones(out.shape[:-1], dtype=torch.bool) if name == "vit" else x[1].bool()


@pytest.fixture(scope="module")
def compiled():
    cache = {}

    def get(name):
        if name not in cache:
            model = hf.build(name)
            cm = qlower.compile(model, inputs(name, 0), quantize="int8",
                                calibration=[inputs(name, i) for i in range(1, 9)], backend="onnxruntime")
            cache[name] = (model, cm)
        return cache[name]
    return get


@pytest.mark.slow
@pytest.mark.parametrize("name", hf.HF_MODELS)
def test_int8_tracks_fp32_on_real_tokens(compiled, name):
    model, cm = compiled(name)
    lowered, total = cm.report().lowered_fraction()
    assert lowered == total > 0
    for seed in (100, 101):
        x = inputs(name, seed)
        with torch.no_grad():
            want = model(*x)
        got = cm(*x)
        keep = real_tokens(name, x, want)
        assert cosine(want[keep], got[keep]) >= 0.995, name


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_padding_tokens_do_not_change_real_tokens(compiled, name):
    """Changing the token ids under the padding mask must not move real-token outputs beyond
    what fp32 itself shows (the mask is applied exactly, never quantized)."""
    model, cm = compiled(name)
    ids, mask = inputs(name, 200)
    other = ids.masked_fill(~mask.bool(), 7)
    keep = mask.bool()
    with torch.no_grad():
        fp32_shift = (model(ids, mask) - model(other, mask))[keep].abs().max()
    int8_shift = (cm(ids, mask) - cm(other, mask))[keep].abs().max()
    assert int8_shift <= fp32_shift + 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2", "vit", "llama"])
def test_int8_program_is_integer_and_onnxruntime_equals_the_reference(name):
    """`int8` makes transformers' BERT, GPT-2, ViT and LLaMA integer programs (no float
    LayerNorm, RMSNorm, softmax or SDPA: eval dropouts dropped, attention decomposed, the
    embedding quantized for its norm), which onnxruntime computes bit for bit like the reference
    backend."""
    model = hf.build(name)
    program = qlower.quantize(model, inputs(name, 0), [inputs(name, i) for i in range(1, 5)], backend="onnxruntime")
    ref, got = (qlower.compile(program, inputs(name, 0), backend=b) for b in ("reference", "onnxruntime"))
    ops = {op.split(".")[0] for op in ref.report().op_counts}
    assert not ops & {"aten::layer_norm", "aten::softmax", "aten::scaled_dot_product_attention", "aten::dropout",
                      "aten::rsqrt", "aten::mean"}, ops
    norm = "qlower::rms_norm_integer" if name == "llama" else "qlower::layer_norm_integer"
    assert "qlower::softmax_integer" in ops and norm in ops
    assert not got.report().fallbacks and len(got.report().compiled) == 1
    for seed in (100, 101):
        assert torch.equal(got(*inputs(name, seed)), ref(*inputs(name, seed)))


@pytest.mark.slow
@pytest.mark.parametrize("name", hf.HF_DECODERS)
def test_kv_cache_decoder_int8_step_by_step(name):
    """A transformers causal LM with its static KV cache in buffers compiles into one
    onnxruntime cluster (state writes aside), keeps its cache across calls, and tracks fp32
    logits step by step (teacher-forced, same tokens to both), with the cache starting empty
    after calibration."""
    import copy
    eager = hf.build(name)
    calibration = hf.decode_steps(1) + hf.decode_steps(2)
    cm = qlower.compile(copy.deepcopy(eager), calibration[0], quantize="int8", calibration=calibration,
                        backend="onnxruntime")
    report = cm.report()
    assert len(report.compiled) == 1, str(report)
    assert not report.fallbacks, str(report)  # state write-backs are "state", not fallbacks
    cosines = []
    for token, position in hf.decode_steps(7):
        with torch.no_grad():
            want = eager(token, position)
        cosines.append(cosine(want, cm(token, position)))
    print(name, [round(c, 4) for c in cosines])
    assert min(cosines) >= 0.99 and sum(cosines) / len(cosines) >= 0.995, cosines


@pytest.mark.slow
def test_replace_recognizes_llama_rms_norm_and_attention():
    """replace() swaps LlamaRMSNorm for the RMSNorm block op (sharing the weight) and routes the
    model's SDPA calls to qlower::attention; outputs stay within float rounding, the exported
    graph holds the block ops as single nodes, and int8 still tracks fp32."""
    from qlower.blockops import replace
    model = hf.build("llama")
    x = inputs("llama", 100)
    with torch.no_grad():
        want = model(*x)
    report = replace(model)
    assert sum(v for k, v in report.replaced.items() if "LlamaRMSNorm" in k) == 5, str(report)  # 2 layers x 2 + final
    with torch.no_grad():
        got = model(*x)
    assert torch.allclose(got, want, atol=1e-5)
    ep = torch.export.export(model, x)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.qlower.rms_norm.default) == 5
    assert targets.count(torch.ops.qlower.attention.default) == 2
    cm = qlower.compile(model, x, quantize="int8", calibration=[inputs("llama", i) for i in range(1, 9)],
                        backend="onnxruntime")
    keep = x[1].bool()
    assert cosine(want[keep], cm(*x)[keep]) >= 0.995
