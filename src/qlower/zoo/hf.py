"""HuggingFace `transformers` models built from small configs with seeded random weights (no
downloads), wrapped to take positional tensors and return the last hidden state. Optional:
`available()` is False when transformers is not installed."""
from __future__ import annotations

import torch


def available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


class LastHidden(torch.nn.Module):
    def __init__(self, model, keys: tuple[str, ...], causal_lm: bool = False):
        super().__init__()
        self.model, self.keys, self.causal_lm = model, keys, causal_lm

    def forward(self, *tensors):
        kwargs = dict(zip(self.keys, tensors))
        if self.causal_lm:
            kwargs["use_cache"] = False
        return self.model(**kwargs).last_hidden_state


def token_batch(seed: int, batch: int = 2, seq: int = 32, vocab: int = 1000) -> tuple:
    """Token ids with right padding: lengths drawn in [8, seq]; mask 1 = real token."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    lengths = torch.randint(8, seq + 1, (batch,), generator=g)
    mask = (torch.arange(seq)[None] < lengths[:, None]).to(torch.int64)
    return ids, mask


def image_batch(seed: int, batch: int = 1) -> tuple:
    return (torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed)),)


def build(name: str) -> torch.nn.Module:
    import transformers as tf
    torch.manual_seed(0)
    common = dict(vocab_size=1000, num_hidden_layers=2, num_attention_heads=4)
    if name == "bert":
        model = tf.BertModel(tf.BertConfig(hidden_size=128, intermediate_size=256, max_position_embeddings=64, **common))
        return LastHidden(model.eval(), ("input_ids", "attention_mask"))
    if name == "gpt2":
        model = tf.GPT2Model(tf.GPT2Config(vocab_size=1000, n_embd=128, n_layer=2, n_head=4, n_positions=64))
        return LastHidden(model.eval(), ("input_ids", "attention_mask"), causal_lm=True)
    if name == "llama":
        model = tf.LlamaModel(tf.LlamaConfig(hidden_size=128, intermediate_size=256, num_key_value_heads=2,
                                             max_position_embeddings=64, **common))
        return LastHidden(model.eval(), ("input_ids", "attention_mask"), causal_lm=True)
    if name == "vit":
        model = tf.ViTModel(tf.ViTConfig(image_size=32, patch_size=8, hidden_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=256))
        return LastHidden(model.eval(), ("pixel_values",))
    raise KeyError(name)


HF_MODELS = ("bert", "gpt2", "llama", "vit")
