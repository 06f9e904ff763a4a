"""qlower.compile_lm / CompiledLM.generate: greedy and sampled text against transformers' own
generate and the eager step loop, batches with left padding, stop tokens, one compile."""
import copy

import pytest
import torch

import qlower
from qlower.errors import InputError
from qlower.generate import CompiledLM, compile_lm, lm_step

tf = pytest.importorskip("transformers")


def tiny_llama(seed: int = 0):
    torch.manual_seed(seed)
    config = tf.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return tf.LlamaForCausalLM(config).eval()


def prompts(batch: int, seq: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 1000, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


@pytest.fixture(scope="module")
def compiled(llama):
    """The float compile on onnxruntime, batch 2, and how many programs were compiled and
    captured while making it."""
    counts = {"compile": 0}
    real = qlower.generate._compile

    def counting(*args, **kwargs):
        counts["compile"] += 1
        return real(*args, **kwargs)
    qlower.generate._compile = counting
    try:
        clm = compile_lm(copy.deepcopy(llama), backend="onnxruntime", batch=2, max_len=40)
    finally:
        qlower.generate._compile = real
    return clm, counts


def test_greedy_equals_transformers_generate_and_compiles_once(llama, compiled, monkeypatch):
    clm, counts = compiled
    assert counts["compile"] == 1 and clm.compiles == 1
    exports = []
    real_export = torch.export.export
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: exports.append(1) or real_export(*a, **k))
    for seq in (5, 11):   # two prompt lengths, 12 new tokens each: every call runs the one program
        ids = prompts(1, seq, seed=seq)
        want = llama.generate(ids, max_new_tokens=12, do_sample=False)
        got = clm.generate(ids, max_new_tokens=12)
        assert got.tolist() == want.tolist()
    assert exports == []   # nothing captured again while generating
    stats = clm.last_stats
    assert (stats.batch, stats.prompt_tokens, stats.new_tokens, stats.decode_calls) == (2, 11, 12, 11)
    assert stats.prefill_tokens_per_s > 0 and stats.decode_tokens_per_s > 0


def test_batch_with_left_padding_equals_each_prompt_alone(llama, compiled):
    clm, _ = compiled
    ids = prompts(2, 9, seed=4)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0   # row 1: a 5-token prompt, left-padded
    got = clm.generate(ids, attention_mask=mask, max_new_tokens=10)
    assert got.tolist() == llama.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False).tolist()
    for row in range(2):
        alone = ids[row:row + 1, mask[row].bool()]
        want = llama.generate(alone, max_new_tokens=10, do_sample=False)[0, alone.shape[1]:]
        assert got[row, 9:].tolist() == want.tolist()


def test_sampling_with_a_seed_is_reproducible(compiled):
    clm, _ = compiled
    ids = prompts(2, 6, seed=5)
    kw = dict(max_new_tokens=8, do_sample=True, temperature=0.8, top_k=50, top_p=0.9)
    first, again = clm.generate(ids, seed=3, **kw), clm.generate(ids, seed=3, **kw)
    assert first.tolist() == again.tolist()
    others = [clm.generate(ids, seed=s, **kw)[:, 6:].tolist() for s in (4, 5)]
    assert any(o != first[:, 6:].tolist() for o in others)   # the seed decides the draw
    # top_k=1 keeps only the argmax: sampling is greedy
    assert clm.generate(ids, do_sample=True, top_k=1, seed=9, max_new_tokens=6).tolist() == \
        clm.generate(ids, max_new_tokens=6).tolist()


def test_stop_token_ends_generation_early(compiled):
    clm, _ = compiled
    ids = prompts(1, 7, seed=6)
    greedy = clm.generate(ids, max_new_tokens=10)[0, 7:].tolist()
    stop = greedy[2]
    first = greedy.index(stop)
    out = clm.generate(ids, max_new_tokens=10, eos_token_id=[999999, stop])
    assert out[0, 7:].tolist() == greedy[:first + 1]
    assert clm.last_stats.decode_calls == first


def test_a_finished_row_is_padded_until_every_row_stops(compiled):
    clm, _ = compiled
    ids = prompts(2, 7, seed=7)
    greedy = clm.generate(ids, max_new_tokens=8)[:, 7:]
    stop = int(greedy[0, 1])
    out = clm.generate(ids, max_new_tokens=8, eos_token_id=stop, pad_token_id=0)[:, 7:]
    row0 = greedy[0].tolist()
    end = row0.index(stop) + 1
    assert out[0, :end].tolist() == row0[:end] and set(out[0, end:].tolist()) <= {0}


def test_bad_generation_requests_are_typed_errors(compiled):
    clm, _ = compiled
    ids = prompts(2, 6)
    right_padded = torch.ones_like(ids)
    right_padded[0, -2:] = 0
    with pytest.raises(InputError, match="right padding"):
        clm.generate(ids, attention_mask=right_padded)
    with pytest.raises(InputError, match="exceed the KV cache"):
        clm.generate(ids, max_new_tokens=40)
    with pytest.raises(InputError, match="compiled for batch 2"):
        clm.generate(prompts(3, 6))
    with pytest.raises(InputError, match="temperature"):
        clm.generate(ids, do_sample=True, temperature=0.0)


@pytest.mark.slow   # two int8 compiles: ~20 s
def test_int8_generation_is_the_reference_backends(llama):
    """The int8 program on onnxruntime computes the reference backend's bits, so its text is
    the reference's too; eager fp32's greedy text on this random-weight model is not a target
    (W8A8 moves its near-tied logits), the bench and the slow SmolLM2 test compare with fp32."""
    calibration = [prompts(1, 16, seed=s) for s in range(4)]
    texts = []
    for backend in ("onnxruntime", "reference"):
        clm = compile_lm(copy.deepcopy(llama), quantize="int8", calibration=calibration, backend=backend,
                         batch=1, max_len=24)
        texts.append(clm.generate(prompts(1, 6, seed=8), max_new_tokens=10).tolist())
    assert texts[0] == texts[1]


def block_lm():
    from qlower.zoo.block_lm import BlockDecoderLM
    torch.manual_seed(0)
    return BlockDecoderLM(max_len=32).eval()


def test_block_lm_prefill_and_decode_through_one_program():
    """The block-op LM: the compiled program's greedy text equals the eager model decoding
    token by token (no prefill), so the multi-token prefill is causal over the cache."""
    model = block_lm()
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(0))
    eager = copy.deepcopy(model)
    token, want = None, []
    with torch.no_grad():
        for pos in range(6 + 9):
            token = ids[:, pos:pos + 1] if pos < 6 else token
            logits = eager(token, torch.tensor(pos))
            if pos >= 5:
                token = logits[:, -1].argmax(-1, keepdim=True)
                want.append(int(token))
    clm = compile_lm(model, backend="onnxruntime", batch=1, max_len=32)
    assert clm.generate(ids, max_new_tokens=10)[0, 6:].tolist() == want
    assert CompiledLM(lm_step(block_lm(), 1, 32), 1, 32, padding=False).generate(ids, max_new_tokens=10)[0, 6:] \
        .tolist() == want
    with pytest.raises(InputError, match="cannot be padded"):
        clm.generate(ids, attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1]]))


def test_compile_lm_is_exported_at_top_level():
    assert qlower.compile_lm is compile_lm and qlower.CompiledLM is CompiledLM


@pytest.mark.slow
@pytest.mark.parametrize("quantize", [None, "int8-weight"])
def test_smollm2_greedy_equals_eager_fp32(quantize):
    from qlower.zoo import smollm2
    if not smollm2.available():
        pytest.skip(smollm2.INSTALL_HINT)
    lm = smollm2.load_lm()
    tok = smollm2.tokenizer()
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    want = lm.generate(ids, max_new_tokens=8, do_sample=False)
    calibration = [torch.tensor(smollm2.TOKEN_IDS[:64])]
    clm = compile_lm(lm, quantize=quantize, calibration=calibration if quantize else None, backend="onnxruntime",
                     max_len=64)
    got = clm.generate(ids, max_new_tokens=8)
    assert " Paris" in tok.decode(want[0, ids.shape[1]:])
    assert got.tolist() == want.tolist()
