"""Text generation with a compiled decoder LM: `qlower.compile_lm(model, ...)` returns a
`CompiledLM` whose `.generate(input_ids, ...)` works like transformers' `generate`.

One program serves the prefill and every decode step: the model is wrapped in a step module
whose KV cache lives in module buffers (compiled state, updated in place on every call), its
inputs are the new tokens and their positions, and the sequence length is dynamic
(1..max_len). It is captured and compiled once; generating any number of tokens, for any
prompt length, never compiles again.

Accepted models:
- a transformers causal LM (`LlamaForCausalLM` & co., anything transformers can run with a
  static cache): batch >= 1 with prompts of different lengths (left padding + attention mask,
  the convention of transformers for decoder-only models; right padding is refused);
- a qlower block-op LM whose `forward(token_ids [B, S], position)` (0-d int64: the cache slot
  of the first token) returns logits [B, S, vocab] and updates its own caches, such as
  `qlower.zoo.block_lm.BlockDecoderLM`. Its rows share one position, so prompts in a batch must
  have the same length (unequal ones are an InputError).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from .api import compile as _compile
from .errors import InputError, QlowerError, QuantizeError
from .quantize import QuantConfig


class CausalLMStep(torch.nn.Module):
    """A transformers causal LM with a static KV cache held in buffers (the cache of
    transformers' export recipe, `TorchExportableModuleWithStaticCache`), one call per prefill
    or decode step: `forward(token_ids [B, S], position_ids [B, S], cache_position [S],
    valid [B, max_len] bool) -> logits [B, vocab]` of the last position. `cache_position` are
    the cache slots the tokens are written to, `position_ids` their positions in their own
    sequence (they differ under left padding), `valid` marks the slots holding real tokens; the
    attention mask (causal, padding) is built from them, as a 4-D mask transformers uses as is."""

    def __init__(self, lm, batch: int = 1, max_len: int = 256):
        super().__init__()
        from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
        config = lm.generation_config
        saved = (config.use_cache, config.cache_implementation)
        config.use_cache, config.cache_implementation = True, "static"   # the recipe checks these
        try:
            self.inner = TorchExportableModuleWithStaticCache(lm, batch_size=batch, max_cache_len=max_len)
        finally:
            config.use_cache, config.cache_implementation = saved
        self.batch, self.max_len = batch, max_len

    def forward(self, token_ids, position_ids, cache_position, valid):
        cache = self.inner.static_cache
        for layer in cache.layers:
            layer.cumulative_length.copy_(cache_position[0])   # where this call's tokens are written
        slots = torch.arange(self.max_len)
        causal = slots[None, :] <= cache_position[:, None]                       # [S, T]
        own = slots[None, :] == cache_position[:, None]   # a padding query sees itself: no empty softmax row
        mask = (causal[None] & valid[:, None, :]) | own[None]                     # [B, S, T]
        out = self.inner.model(input_ids=token_ids, position_ids=position_ids, attention_mask=mask[:, None],
                                past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1]


class OffsetLMStep(torch.nn.Module):
    """A block-op LM (`forward(token_ids, position)` with its own KV cache) as a step module:
    `forward(token_ids [B, S], position 0-d) -> logits [B, vocab]` of the last position."""

    def __init__(self, model, batch: int, max_len: int):
        super().__init__()
        self.model, self.batch, self.max_len = model, batch, max_len

    def forward(self, token_ids, position):
        return self.model(token_ids, position)[:, -1]


def is_transformers_lm(model) -> bool:
    return hasattr(model, "generation_config") and hasattr(model, "config") and hasattr(model, "get_output_embeddings")


def lm_step(model, batch: int = 1, max_len: int = 256) -> torch.nn.Module:
    """The step module `compile_lm` compiles for `model` (uncompiled: it runs the model eagerly)."""
    if is_transformers_lm(model):
        return CausalLMStep(model.eval(), batch, max_len).eval()
    return OffsetLMStep(model.eval(), batch, max_len).eval()


@dataclass
class GenerationStats:
    """Timings of the last `generate` call: the prefill (one call, the whole prompt) and the
    decode calls (one new token per row each)."""
    batch: int
    prompt_tokens: int          # per row, padding included
    new_tokens: int             # per row, the first (from the prefill's logits) included
    decode_calls: int
    prefill_s: float
    decode_s: float

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.batch * self.prompt_tokens / self.prefill_s

    @property
    def decode_tokens_per_s(self) -> float:
        return self.batch * self.decode_calls / self.decode_s if self.decode_calls else float("nan")


class CompiledLM:
    """A decoder LM compiled for generation (made by `compile_lm`). `step` is the compiled step
    module (a CompiledModule; an uncompiled step module runs eagerly, the same loop).

    `compiles` counts the programs compiled for it: 1, whatever is generated afterwards.
    Threads: one `generate` runs at a time (the calls share the KV cache)."""

    def __init__(self, step, batch: int, max_len: int, padding: bool, compiles: int = 0):
        self.step, self.batch, self.max_len, self.padding = step, batch, max_len, padding
        self.compiles = compiles
        self.last_stats: GenerationStats | None = None
        self._lock = threading.Lock()

    def report(self):
        return self.step.report()

    def generate(self, input_ids, max_new_tokens: int = 20, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, eos_token_id=None, pad_token_id=None,
                 attention_mask=None, seed: int | None = None, generator: torch.Generator | None = None
                 ) -> torch.Tensor:
        """Continue `input_ids` ([B, S] or [S], int64; B <= the compiled batch) by up to
        `max_new_tokens` tokens; returns [B, S + n], the prompt followed by the new tokens, as
        transformers' `generate` does. Greedy by default; `do_sample=True` samples from
        softmax(logits / temperature), restricted to the `top_k` most likely tokens and the
        smallest set whose probability reaches `top_p`, drawn with `generator` (or a new one
        seeded with `seed`: equal seeds, equal text). `eos_token_id` (an id or a list) ends a
        row; a finished row continues with `pad_token_id` (default: the first stop id), and the
        call returns as soon as every row has finished. `attention_mask` [B, S]: 1 = token,
        0 = left padding. Timings of the call: `last_stats`."""
        with self._lock, torch.no_grad():
            return self._generate(input_ids, max_new_tokens, do_sample, temperature, top_k, top_p, eos_token_id,
                                  pad_token_id, attention_mask, seed, generator)

    def _generate(self, input_ids, max_new_tokens, do_sample, temperature, top_k, top_p, eos_token_id, pad_token_id,
                  attention_mask, seed, generator) -> torch.Tensor:
        """`generate` under its lock, without autograd."""
        ids = torch.as_tensor(input_ids)
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            raise InputError(f"input_ids must be token ids [batch, seq] (int64), got {tuple(ids.shape)} {ids.dtype}")
        ids = ids.to(torch.int64)
        rows, seq = ids.shape
        mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask).reshape(ids.shape)
        self._check(rows, seq, max_new_tokens, mask)
        stops = torch.as_tensor([] if eos_token_id is None else eos_token_id, dtype=torch.int64).reshape(-1)
        pad = int(pad_token_id if pad_token_id is not None else stops[0] if len(stops) else 0)
        if do_sample and generator is None:
            generator = torch.Generator()
            generator.manual_seed(seed if seed is not None else int(torch.seed()))
        fill = self.batch - rows   # rows the compiled batch has beyond the caller's: copies of row 0
        full_ids = torch.cat([ids, ids[:1].expand(fill, seq)]) if fill else ids
        full_mask = torch.cat([mask, mask[:1].expand(fill, seq)]) if fill else mask
        full_mask = full_mask.to(torch.bool)

        valid = torch.zeros(self.batch, self.max_len, dtype=torch.bool)
        valid[:, :seq] = full_mask
        positions = (full_mask.to(torch.int64).cumsum(1) - 1).clamp_min(0)
        start = time.perf_counter()
        logits = self._call(full_ids, positions, torch.arange(seq), valid)
        prefill_s = time.perf_counter() - start
        next_pos = full_mask.sum(1)
        finished = torch.zeros(self.batch, dtype=torch.bool)
        new: list[torch.Tensor] = []
        calls, start = 0, time.perf_counter()
        for i in range(max_new_tokens):
            token = _choose(logits[:rows].float(), do_sample, temperature, top_k, top_p, generator)
            token = torch.where(finished[:rows], pad, token)
            new.append(token)
            finished[:rows] |= torch.isin(token, stops)
            if i == max_new_tokens - 1 or bool(finished[:rows].all()):
                break
            slot = seq + i
            valid[:, slot] = True
            step_tokens = torch.cat([token, token[:1].expand(fill)]) if fill else token
            logits = self._call(step_tokens[:, None], next_pos[:, None], torch.tensor([slot]), valid)
            next_pos = next_pos + 1
            calls += 1
        decode_s = time.perf_counter() - start
        self.last_stats = GenerationStats(self.batch, seq, len(new), calls, prefill_s, decode_s)
        return torch.cat([ids, torch.stack(new, 1)], 1) if new else ids

    def _call(self, token_ids, position_ids, cache_position, valid):
        if self.padding:
            return self.step(token_ids, position_ids, cache_position, valid)
        return self.step(token_ids, cache_position[0])

    def _check(self, rows: int, seq: int, max_new_tokens: int, mask: torch.Tensor) -> None:
        if not 1 <= rows <= self.batch:
            raise InputError(f"{rows} prompts, but this LM was compiled for batch {self.batch}",
                             hint=f"compile_lm(model, batch={rows}) (a compiled batch runs fewer rows too)")
        if seq < 1 or max_new_tokens < 1:
            raise InputError("generate needs a prompt of at least one token and max_new_tokens >= 1")
        if seq + max_new_tokens > self.max_len:
            raise InputError(f"prompt ({seq}) + max_new_tokens ({max_new_tokens}) exceed the KV cache "
                             f"({self.max_len} positions)", hint="compile_lm(model, max_len=...) with a larger cache")
        bits = mask.to(torch.int64)
        if ((bits != 0) & (bits != 1)).any() or (bits.sum(1) == 0).any():
            raise InputError("attention_mask must hold 0 (padding) and 1 (token), with a token in every row")
        if (bits[:, 1:] < bits[:, :-1]).any():
            raise InputError("attention_mask has padding after a token (right padding)",
                             hint="pad prompts on the left (tokenizer.padding_side = 'left'), as for "
                                  "transformers' generate with decoder-only models")
        if not self.padding and (bits == 0).any():
            raise InputError("this LM's rows share one position, so its prompts cannot be padded",
                             hint="generate prompts of different lengths in separate calls, or use a transformers "
                                  "model (position ids per row)")


def _choose(logits: torch.Tensor, do_sample: bool, temperature: float, top_k, top_p, generator) -> torch.Tensor:
    """The next token per row: argmax, or a draw from the filtered, tempered distribution."""
    if not do_sample:
        return logits.argmax(-1)
    if temperature <= 0:
        raise InputError(f"temperature must be > 0 when sampling, got {temperature}",
                         hint="do_sample=False for greedy decoding")
    scores = logits / temperature
    if top_k is not None and top_k > 0:
        kth = torch.topk(scores, min(top_k, scores.shape[-1]), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        order = scores.argsort(-1, descending=True)
        probs = scores.gather(-1, order).softmax(-1)
        drop = probs.cumsum(-1) - probs >= top_p   # tokens after the smallest set reaching top_p
        scores = scores.scatter(-1, order, scores.gather(-1, order).masked_fill(drop, float("-inf")))
    return torch.multinomial(scores.softmax(-1), 1, generator=generator)[:, 0]


def preset_exists(name: str) -> bool:
    """Whether `quantize=name` names a preset of this build."""
    try:
        QuantConfig.from_name(name)
    except QuantizeError:
        return False
    return True


def step_inputs(step: torch.nn.Module, token_ids: torch.Tensor) -> tuple:
    """The prefill call of `step` for prompts `token_ids` [B, S] (unpadded), e.g. for calibration."""
    token_ids = torch.as_tensor(token_ids, dtype=torch.int64)
    token_ids = token_ids[None] if token_ids.dim() == 1 else token_ids
    batch, seq = token_ids.shape
    if batch < step.batch:
        token_ids = torch.cat([token_ids, token_ids[:1].expand(step.batch - batch, seq)])
    if isinstance(step, OffsetLMStep):
        return token_ids, torch.tensor(0)
    valid = torch.zeros(step.batch, step.max_len, dtype=torch.bool)
    valid[:, :seq] = True
    return token_ids, torch.arange(seq).expand(step.batch, seq).contiguous(), torch.arange(seq), valid


def compile_lm(model, quantize=None, calibration=None, backend: str = "onnxruntime", batch: int = 1,
               max_len: int = 256, backend_options=None, **compile_kwargs) -> CompiledLM:
    """Compile a decoder LM for `CompiledLM.generate`, once.

    model:       a transformers causal LM, or a block-op LM (module docstring).
    quantize:    as for `qlower.compile` (None: float; "int8", a weight-only preset, a QuantConfig).
    calibration: prompts as token ids ([S] or [B, S] tensors; a few hundred tokens of real text),
                 run through the prefill to calibrate; required where `quantize` needs data.
    backend:     as for `qlower.compile`; default "onnxruntime" ("auto" compiles every engine
                 to measure them, minutes for a real LM).
    batch:       rows per call (generate takes 1..batch prompts); max_len: KV cache positions,
                 prompt + new tokens.
    Other keyword arguments go to `qlower.compile`."""
    if batch < 1 or max_len < 2:
        raise QlowerError(f"compile_lm needs batch >= 1 and max_len >= 2, got batch={batch}, max_len={max_len}")
    step = lm_step(model, batch, max_len)
    padding = isinstance(step, CausalLMStep)
    example = step_inputs(step, torch.zeros(1, min(8, max_len), dtype=torch.int64))
    seq = torch.export.Dim("seq", min=1, max=max_len)
    dynamic = ({1: seq}, {1: seq}, {0: seq}, None) if padding else ({1: seq}, None)
    calib = None
    if calibration is not None:
        calibration = [torch.as_tensor(c) for c in calibration]
        long = [tuple(c.shape) for c in calibration if c.shape[-1] > max_len]
        if long:
            raise QuantizeError(f"calibration prompts {long} are longer than the KV cache ({max_len} positions)",
                                hint="cut them to max_len tokens, or a larger cache: compile_lm(model, max_len=...)")
        calib = [step_inputs(step, c) for c in calibration]
    with _state_kept(step), torch.no_grad():   # no autograd history in the cache buffers
        cm = _compile(step, example, quantize=quantize, calibration=calib, backend=backend, dynamic_shapes=dynamic,
                      backend_options=backend_options, **compile_kwargs)
    return CompiledLM(cm, batch, max_len, padding, compiles=1)


class _state_kept:
    """The step module's buffers (its KV cache) restored after compiling (calibration and the
    engine's checks ran it): the caller's model is left as it was."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def __enter__(self):
        self.saved = {n: b.clone() for n, b in self.module.named_buffers()}

    def __exit__(self, *exc):
        with torch.no_grad():
            for n, b in self.module.named_buffers():
                if n in self.saved and b.shape == self.saved[n].shape:
                    b.copy_(self.saved[n])
        return False
