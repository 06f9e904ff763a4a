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
