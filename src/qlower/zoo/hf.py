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


class SentenceEncoder(torch.nn.Module):
    """Sentence embeddings as sentence-transformers computes them: encoder hidden states,
    mean-pooled over real tokens (attention mask), L2-normalised."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1)


class CachedDecoderStep(torch.nn.Module):
    """One decoding step of a transformers causal LM with a static KV cache held in buffers
    (transformers' own export recipe, `TorchExportableModuleWithStaticCache`):
    `forward(token_ids [B, S], cache_position [S]) -> logits`. The cache lives in the module
    and survives across calls, so a CompiledModule of it generates step by step."""

    def __init__(self, lm, max_cache_len: int = 64, batch: int = 1):
        super().__init__()
        from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
        lm.generation_config.use_cache = True
        lm.generation_config.cache_implementation = "static"
        self.inner = TorchExportableModuleWithStaticCache(lm, batch_size=batch, max_cache_len=max_cache_len)

    def forward(self, token_ids, cache_position):
        return self.inner(input_ids=token_ids, cache_position=cache_position)


def decode_steps(seed: int, steps: int = 16, vocab: int = 1000) -> list[tuple]:
    """(token [1, 1], position [1]) inputs for `steps` consecutive decoding steps."""
    ids = torch.randint(0, vocab, (1, steps), generator=torch.Generator().manual_seed(seed))
    return [(ids[:, i:i + 1], torch.tensor([i])) for i in range(steps)]


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
        model = tf.BertModel(tf.BertConfig(hidden_size=128, intermediate_size=256, max_position_embeddings=64,
                                           **common))
        return LastHidden(model.eval(), ("input_ids", "attention_mask"))
    if name == "gpt2":
        model = tf.GPT2Model(tf.GPT2Config(vocab_size=1000, n_embd=128, n_layer=2, n_head=4, n_positions=64))
        return LastHidden(model.eval(), ("input_ids", "attention_mask"), causal_lm=True)
    if name == "llama":
        model = tf.LlamaModel(tf.LlamaConfig(hidden_size=128, intermediate_size=256, num_key_value_heads=2,
                                             max_position_embeddings=64, **common))
        return LastHidden(model.eval(), ("input_ids", "attention_mask"), causal_lm=True)
    if name in ("gpt2-kv", "llama-kv"):
        if name == "gpt2-kv":
            lm = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=1000, n_embd=128, n_layer=2, n_head=4, n_positions=64))
        else:
            lm = tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=128, intermediate_size=256, num_key_value_heads=2,
                                                    max_position_embeddings=64, **common))
        return CachedDecoderStep(lm.eval())
    if name in ("bert-base", "llama-base"):  # realistic widths (4 layers): where int8 GEMMs pay off
        wide = dict(vocab_size=1000, num_hidden_layers=4, num_attention_heads=12, hidden_size=768,
                    max_position_embeddings=256)
        if name == "bert-base":
            model = tf.BertModel(tf.BertConfig(intermediate_size=3072, **wide))
            return LastHidden(model.eval(), ("input_ids", "attention_mask"))
        model = tf.LlamaModel(tf.LlamaConfig(intermediate_size=2048, num_key_value_heads=4, **wide))
        return LastHidden(model.eval(), ("input_ids", "attention_mask"), causal_lm=True)
    if name == "sentence":
        model = tf.BertModel(tf.BertConfig(hidden_size=128, intermediate_size=256, max_position_embeddings=64,
                                           **common))
        return SentenceEncoder(model.eval())
    if name == "vit":
        model = tf.ViTModel(tf.ViTConfig(image_size=32, patch_size=8, hidden_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=256))
        return LastHidden(model.eval(), ("pixel_values",))
    raise KeyError(name)


HF_MODELS = ("bert", "gpt2", "llama", "vit")
HF_ENCODERS = ("sentence",)   # BERT + mask mean pooling + L2 norm (sentence-transformers style)
HF_DECODERS = ("gpt2-kv", "llama-kv")   # step-by-step decoding with a static KV cache
HF_WIDE = ("bert-base", "llama-base")   # bench only (seq 128): too slow to quantize in unit tests
