"""`qlower bench --suite llm`: greedy generation of a decoder LM on qlower and its peers, side
by side in one process: prefill of a 128-token prompt and 128 decoded tokens at batch 1 and 4,
tokens per second of each phase, the resident memory each stack added, and the
memory-bandwidth floor of a decode step.

Stacks (each one thread; a peer that is not installed or cannot run the model on this CPU is a
row with the reason):
- eager-fp32           the transformers model in PyTorch, the loop of `CompiledLM.generate`
- torchao-int8-weight  torchao `Int8WeightOnlyConfig` on the eager model
- torchao-int4-weight  torchao `Int4WeightOnlyConfig` (group 128) on the eager model
- ort-int4             the model exported with torch.onnx (KV cache as inputs/outputs), its
                       MatMuls turned into `MatMulNBits` by ONNX Runtime's `MatMulNBitsQuantizer`
                       (4 bits, asymmetric, block 128 or the largest power of two dividing the
                       widths: 64 for SmolLM2's 576; accuracy level 4: int8 activations in the
                       kernel, ONNX Runtime's recommendation for CPU)
- openvino-nncf-int4   the same export read by OpenVINO, weights compressed by NNCF
                       `compress_weights` (INT4_ASYM, the same group as ort-int4; NNCF keeps
                       embeddings and the output layer in 8 bits)
- llama.cpp            `llama_cpp` (llama-cpp-python) on the model's GGUF file (SmolLM2: the
                       bundled Q4_1 file, the same weights); batch 1 only (its Python API
                       decodes one sequence)
- qlower-<preset>      `qlower.compile_lm(model, quantize=preset, backend="onnxruntime")`,
                       `fp32` for no quantization; a preset this build does not have is a row
                       saying so; `+int8` after a weight-only preset: `OrtOptions(
                       weight_only_compute="int8")` (ONNX Runtime's accuracy level 4, as ort-int4);
                       `@openvino` at the end: backend="openvino" instead (not in the default plan)

Timing: one warm-up generation per stack, then `rounds` rounds; in each round every stack runs
one whole generation (prefill, then the decode steps), stacks in alternating order. Each number
is the median over rounds; "x eager" is the median of the per-round ratios to eager fp32 (paired:
a slow moment of this shared machine affects both). The floor: bytes of weights one decode step
reads (every linear weight and the output embedding, at the stack's width) divided by the
bandwidth of a large numpy copy measured at the start (`copy_bandwidth`).
"""
from __future__ import annotations

import contextlib
import copy
import gc
import json
import re
import statistics
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..generate import CompiledLM, compile_lm, lm_step, preset_exists
from .logcapture import LogCapture
from .machine import describe, machine_info
from .stacks import installed, ov_config

LLM_STACKS = ("eager-fp32", "torchao-int8-weight", "torchao-int4-weight", "ort-int4", "openvino-nncf-int4",
              "llama.cpp", "qlower-int8", "qlower-int8-weight", "qlower-int4-weight", "qlower-int4-weight+int8")
LLM_MODELS = ("smollm2-135m",)            # the default plan; "llama-random-0.5b" on request
GROUP = 128                                # the 4-bit peers' group (block) size, where it divides the widths


def group_size(lm: torch.nn.Module, preferred: int = GROUP) -> int:
    """`preferred`, or the largest power of two below it dividing every linear layer's input
    width (NNCF refuses a group that does not divide it: SmolLM2's 576 takes 64)."""
    widths = {m.in_features for m in lm.modules() if isinstance(m, torch.nn.Linear)}
    group = preferred
    while group > 8 and any(w % group for w in widths):
        group //= 2
    return group


class Skipped(RuntimeError):
    """A stack cannot run here (library missing, no kernel on this CPU, unknown preset)."""


# ------------------------------------------------------------------------------ models
@dataclass
class LLMModel:
    name: str
    lm: torch.nn.Module           # float transformers causal LM, eval mode
    gguf: Path | None             # llama.cpp's file of the same weights, if there is one
    prompt_ids: Callable[[int, int], torch.Tensor]   # (batch, seq) -> token ids
    calibration: list[torch.Tensor]


def build_model(name: str) -> LLMModel:
    """smollm2-135m: the real SmolLM2-135M-Instruct (zoo/smollm2.py); llama-random-0.5b: a
    LLaMA-architecture config of 0.58 B parameters with seeded random weights (decode past the
    caches); tiny-llama: two layers, for the tests. The random ones take SmolLM2's vocabulary
    size, so their GGUF files (`write_gguf`) carry SmolLM2's tokenizer."""
    from ..zoo import smollm2
    if name == "smollm2-135m":
        lm = smollm2.load_lm()
        return LLMModel(name, lm, smollm2.gguf_path(), _text_prompts(lm.config.vocab_size), _calibration(49152))
    from transformers import LlamaConfig, LlamaForCausalLM
    if name == "llama-random-0.5b":
        config = LlamaConfig(vocab_size=49152, hidden_size=1536, intermediate_size=4096, num_hidden_layers=20,
                             num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
                             tie_word_embeddings=True)
    elif name == "tiny-llama":
        config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                             tie_word_embeddings=True)
    else:
        raise ValueError(f"unknown LLM bench model {name!r}; choose from smollm2-135m, llama-random-0.5b, tiny-llama")
    torch.manual_seed(0)
    lm = LlamaForCausalLM(config).eval()
    return LLMModel(name, lm, None, _text_prompts(config.vocab_size), _calibration(config.vocab_size))


def _text_prompts(vocab: int) -> Callable[[int, int], torch.Tensor]:
    """Windows of the bundled English text (smollm2.TOKEN_IDS), one per row."""
    from ..zoo.smollm2 import TextWindows

    def make(batch: int, seq: int) -> torch.Tensor:
        return TextWindows(seq=seq, stride=37).batch(batch, seed=0) % vocab
    return make


def _calibration(vocab: int) -> list[torch.Tensor]:
    from ..zoo.smollm2 import SPLIT, TOKEN_IDS
    ids = torch.tensor(TOKEN_IDS[:SPLIT]) % vocab
    return [ids[s:s + 64] for s in range(0, SPLIT - 64 + 1, 32)]   # 5 windows of 64 tokens


def weight_params(lm: torch.nn.Module) -> int:
    """Weights one decode step reads: every linear layer's (the output layer included; a tied
    embedding is read once as the output layer, its lookup reads one row)."""
    return sum(m.weight.numel() for m in lm.modules() if isinstance(m, torch.nn.Linear))


def write_gguf(lm, path: Path, vocab_from: Path, qtype: str = "Q4_0") -> Path:
    """A LLaMA-architecture transformers model as a GGUF file llama.cpp runs, written with the
    `gguf` package: the config as llama.* metadata, the tokenizer copied from `vocab_from` (a GGUF
    of the same vocabulary: SmolLM2's, 49152 tokens), 2-D weights as `qtype` (Q4_0, Q8_0, F32),
    norms as F32. q/k rows are reordered from transformers' half-split rotary layout to the
    adjacent pairs llama.cpp's LLaMA rotary uses."""
    import gguf
    if path.exists():
        return path
    c = lm.config
    heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta", getattr(c, "rope_theta", 10000.0))
    reader = gguf.GGUFReader(str(vocab_from))

    def field(key):
        f = reader.fields[key]
        return [f.parts[i] for i in f.data]
    tokens = [bytes(p) for p in field("tokenizer.ggml.tokens")]
    if len(tokens) != c.vocab_size:
        raise ValueError(f"{vocab_from.name} has {len(tokens)} tokens, the model {c.vocab_size}")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(theta))
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    writer.add_tokenizer_model(bytes(field("tokenizer.ggml.model")[0]).decode())
    writer.add_tokenizer_pre(bytes(field("tokenizer.ggml.pre")[0]).decode())
    writer.add_token_list(tokens)
    writer.add_token_types([int(p[0]) for p in field("tokenizer.ggml.token_type")])
    writer.add_token_merges([bytes(p) for p in field("tokenizer.ggml.merges")])
    writer.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id")[0][0]))
    writer.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id")[0][0]))
    quant = gguf.GGMLQuantizationType[qtype]

    def pairs(w: np.ndarray, n: int) -> np.ndarray:   # half-split rotary rows -> adjacent pairs
        return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    def add(name: str, t: torch.Tensor, q=None):
        data = t.detach().float().numpy()
        if q is None or q == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, np.ascontiguousarray(data))
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, q), raw_dtype=q)   # shape: from the bytes
    model = lm.model
    add("token_embd.weight", model.embed_tokens.weight, quant)
    for i, layer in enumerate(model.layers):
        a, m = layer.self_attn, layer.mlp
        add(f"blk.{i}.attn_norm.weight", layer.input_layernorm.weight)
        add(f"blk.{i}.attn_q.weight", torch.from_numpy(pairs(a.q_proj.weight.detach().numpy(), heads)), quant)
        add(f"blk.{i}.attn_k.weight", torch.from_numpy(pairs(a.k_proj.weight.detach().numpy(), kv_heads)), quant)
        add(f"blk.{i}.attn_v.weight", a.v_proj.weight, quant)
        add(f"blk.{i}.attn_output.weight", a.o_proj.weight, quant)
        add(f"blk.{i}.ffn_norm.weight", layer.post_attention_layernorm.weight)
        add(f"blk.{i}.ffn_gate.weight", m.gate_proj.weight, quant)
        add(f"blk.{i}.ffn_up.weight", m.up_proj.weight, quant)
        add(f"blk.{i}.ffn_down.weight", m.down_proj.weight, quant)
    add("output_norm.weight", model.norm.weight)
    if not c.tie_word_embeddings:
        add("output.weight", lm.lm_head.weight, quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ------------------------------------------------------------------------------ bandwidth
def copy_bandwidth(mb: int = 512, repeats: int = 8) -> float:
    """GB/s of one thread copying a `mb` MB float32 array with numpy (bytes read + written),
    the best of `repeats`: the rate at which this machine streams memory, far beyond its caches."""
    src = np.ones(mb * 2**20 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best / 1e9


BITS = {"eager-fp32": 32, "qlower-fp32": 32, "torchao-int8-weight": 8, "qlower-int8": 8, "qlower-int8-weight": 8,
        "torchao-int4-weight": 4, "ort-int4": 4, "openvino-nncf-int4": 4, "qlower-int4-weight": 4,
        "llama.cpp": 4}


def stack_bits(stack: str) -> int | None:
    """The weight width a stack's floor counts: a qlower stack's preset's (`+compute`, `@backend` dropped)."""
    return BITS.get(stack.partition("@")[0].partition("+")[0])


def floor_ms(params: int, bits: int, bandwidth_gbs: float, group: int = GROUP) -> float:
    """Milliseconds to read `params` weights of `bits` bits (plus a float16 scale and zero point
    per group for 4 bits, a float32 scale per 576-wide channel for 8 bits, roughly) once."""
    extra = 4 / group if bits == 4 else 4 / 576 if bits == 8 else 0.0
    return params * (bits / 8 + extra) / (bandwidth_gbs * 1e9) * 1e3


# ------------------------------------------------------------------------------ stacks
class Runner:
    """One stack built for one batch size: `generate(ids, new)` -> (new tokens [B, new],
    prefill seconds, decode seconds, decode calls)."""

    def generate(self, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, float, float, int]:
        raise NotImplementedError


class LMRunner(Runner):
    """A CompiledLM (compiled, or the step module run eagerly)."""

    def __init__(self, clm: CompiledLM):
        self.clm = clm

    def generate(self, ids, new):
        out = self.clm.generate(ids, max_new_tokens=new)
        s = self.clm.last_stats
        return out[:, ids.shape[1]:], s.prefill_s, s.decode_s, s.decode_calls


class FunctionalStep(torch.nn.Module):
    """A decode/prefill step with the KV cache as inputs and outputs (ONNX has no state), in the
    form ONNX Runtime's and OpenVINO's LLM exports take: `forward(token_ids [B, S], position_ids
    [B, S], *past) -> (logits [B, vocab], *present)` (unpadded rows), past = key_0,
    value_0, key_1, ... each [B, kv_heads, P, head_dim] (P = 0 for the prefill), present the same
    with P + S positions (the new entries appended). The output layer is a MatMul with a constant
    [hidden, vocab] weight (the tied embedding transposed once here), so the peers' weight
    quantizers see it as a weight."""

    def __init__(self, lm):
        super().__init__()
        from transformers.cache_utils import DynamicLayer
        self.lm = lm
        self.layers = lm.config.num_hidden_layers
        self.head_t = torch.nn.Parameter(lm.get_output_embeddings().weight.detach().t().contiguous(),
                                         requires_grad=False)

        class Layer(DynamicLayer):
            def update(self, key_states, value_states, *args, **kwargs):
                self.keys = torch.cat([self.keys, key_states], dim=-2)
                self.values = torch.cat([self.values, value_states], dim=-2)
                return self.keys, self.values
        self.layer_class = Layer

    def forward(self, token_ids, position_ids, *past):
        from transformers.cache_utils import Cache
        layers = []
        for i in range(self.layers):
            layer = self.layer_class()
            layer.keys, layer.values, layer.is_initialized = past[2 * i], past[2 * i + 1], True
            layers.append(layer)
        cache = Cache(layers=layers)
        seen, seq = past[0].shape[2], token_ids.shape[1]
        slots = torch.arange(seen + seq)
        positions = torch.arange(seq) + seen
        mask = (slots[None, :] <= positions[:, None]).expand(token_ids.shape[0], 1, seq, seen + seq)   # causal
        hidden = self.lm.model(input_ids=token_ids, position_ids=position_ids, attention_mask=mask,
                               past_key_values=cache, use_cache=True).last_hidden_state
        return (hidden[:, -1] @ self.head_t, *[t for layer in layers for t in (layer.keys, layer.values)])


def kv_shape(lm, batch: int, length: int) -> tuple[int, ...]:
    c = lm.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return (batch, c.num_key_value_heads, length, head_dim)


def export_functional(lm, max_len: int, path: Path) -> Path:
    """The float model as ONNX (torch.onnx, dynamo), batch, sequence and past length dynamic."""
    if path.exists():
        return path
    step = FunctionalStep(lm).eval()
    batch, seq, seen = 2, 3, 4
    past = [torch.zeros(kv_shape(lm, batch, seen)) for _ in range(2 * step.layers)]
    args = (torch.zeros(batch, seq, dtype=torch.int64), torch.arange(seen, seen + seq).expand(batch, seq).contiguous(),
            *past)
    b, s = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=1, max=max_len)
    p = torch.export.Dim("past", min=1, max=max_len)   # 0 at the prefill: the ONNX graph has no guard
    dynamic = ({0: b, 1: s}, {0: b, 1: s}, tuple({0: b, 2: p} for _ in past))   # *past: one group
    names = ["token_ids", "position_ids"] + [f"{w}_{i}" for i in range(step.layers) for w in ("key", "value")]
    with torch.no_grad():
        torch.onnx.export(step, args, str(path), dynamo=True, dynamic_shapes=dynamic, input_names=names,
                          external_data=True, verbose=False)
    return path


class FunctionalRunner(Runner):
    """The greedy loop over an engine running `FunctionalStep` (`run(inputs dict) -> [logits, *present]`)."""

    def __init__(self, run: Callable, lm, batch: int, max_len: int, layers: int):
        self.run, self.batch, self.max_len, self.layers = run, batch, max_len, layers
        self.lm = lm

    def _feed(self, ids, positions, kv):
        feed = {"token_ids": ids, "position_ids": positions}
        feed.update({f"{w}_{i // 2}": kv[i] for i, w in zip(range(2 * self.layers), ("key", "value") * self.layers)})
        return feed

    def generate(self, ids, new):
        ids = ids.numpy()
        b, seq = ids.shape
        kv = [np.zeros(kv_shape(self.lm, b, 0), dtype=np.float32) for _ in range(2 * self.layers)]
        start = time.perf_counter()
        out = self.run(self._feed(ids, np.broadcast_to(np.arange(seq), (b, seq)).copy(), kv))
        prefill = time.perf_counter() - start
        logits, kv = out[0], list(out[1:])
        tokens, calls, start = [], 0, time.perf_counter()
        for i in range(new):
            token = logits.argmax(-1)
            tokens.append(token)
            if i == new - 1:
                break
            slot = seq + i
            out = self.run(self._feed(token[:, None].astype(np.int64), np.full((b, 1), slot, dtype=np.int64), kv))
            logits, kv = out[0], list(out[1:])
            calls += 1
        return torch.from_numpy(np.stack(tokens, 1)), prefill, time.perf_counter() - start, calls


def _matmul_nbits_quantizer():
    """ONNX Runtime's MatMulNBitsQuantizer. Its module calls `logging.basicConfig(level=INFO)` when
    imported, after which every library's INFO records (hundreds from onnxscript's rewriter) would
    print for the rest of the run: the root logger's handlers and level are put back."""
    import logging
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    root.handlers[:] = handlers
    root.setLevel(level)
    return MatMulNBitsQuantizer


def _ort_int4(model: LLMModel, batch: int, max_len: int, workdir: Path) -> Runner:
    import onnx
    import onnxruntime as ort
    MatMulNBitsQuantizer = _matmul_nbits_quantizer()
    dst = workdir / f"{model.name}-int4.onnx"
    if not dst.exists():
        src = export_functional(model.lm, max_len, workdir / f"{model.name}-fp32.onnx")
        quantizer = MatMulNBitsQuantizer(onnx.load(str(src)), bits=4, block_size=group_size(model.lm),
                                         is_symmetric=False, accuracy_level=4)
        quantizer.process()
        quantizer.model.save_model_to_file(str(dst), use_external_data_format=True)
    so = ort.SessionOptions()
    so.intra_op_num_threads = torch.get_num_threads()
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    session = ort.InferenceSession(str(dst), so, providers=["CPUExecutionProvider"])
    return FunctionalRunner(lambda feed: session.run(None, feed), model.lm, batch, max_len,
                            model.lm.config.num_hidden_layers)


def _openvino_int4(model: LLMModel, batch: int, max_len: int, workdir: Path) -> Runner:
    import nncf
    import openvino as ov
    core = ov.Core()
    ov_model = core.read_model(str(export_functional(model.lm, max_len, workdir / f"{model.name}-fp32.onnx")))
    compressed = nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode.INT4_ASYM,
                                       group_size=group_size(model.lm))
    compiled = core.compile_model(compressed, "CPU", ov_config())
    request = compiled.create_infer_request()
    names = [i.get_any_name() for i in compiled.inputs]

    def run(feed):
        result = request.infer([feed[n] for n in names], share_inputs=True)
        return [result[o].copy() for o in compiled.outputs]
    return FunctionalRunner(run, model.lm, batch, max_len, model.lm.config.num_hidden_layers)


def _torchao(model: LLMModel, batch: int, max_len: int, bits: int) -> Runner:
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    lm = copy.deepcopy(model.lm)
    config = Int8WeightOnlyConfig() if bits == 8 else Int4WeightOnlyConfig(group_size=GROUP)
    try:
        quantize_(lm, config)
        probe = lm_step(lm, batch, max_len)
        with torch.no_grad():
            CompiledLM(probe, batch, max_len, padding=True).generate(model.prompt_ids(batch, 4), max_new_tokens=2)
    except Exception as exc:   # torchao's CPU support differs per config and version: the reason is the row
        raise Skipped(f"torchao {type(config).__name__} does not run on this CPU: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:160]}") from exc
    return LMRunner(CompiledLM(probe, batch, max_len, padding=True))


_LLAMA_PROBE = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=64, n_batch=64, n_threads=1, verbose=False)
llm.eval(list(range(100, 116)))
"""


def llama_cpp_batched_prefill_works(gguf: Path) -> tuple[bool, str]:
    """Whether llama.cpp evaluates a 16-token batch here, tried in a child process: a build of
    llama.cpp whose batched CPU kernels fault on this CPU kills its process (a signal, not an
    exception)."""
    import subprocess
    import sys
    code = f"import sys\nsys.path[:0] = {[p for p in sys.path if p]!r}\n" + _LLAMA_PROBE   # this process's imports
    done = subprocess.run([sys.executable, "-c", code, str(gguf)], capture_output=True, text=True, timeout=300)
    if done.returncode == 0:
        return True, ""
    why = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
    return False, (f"llama.cpp's batched prompt evaluation died ({why}) on this CPU: prompt evaluated one token "
                   "at a time")


class LlamaCppRunner(Runner):
    def __init__(self, gguf: Path, max_len: int):
        from llama_cpp import Llama
        threads = torch.get_num_threads()
        batched, self.note = llama_cpp_batched_prefill_works(gguf)
        self.llm = Llama(model_path=str(gguf), n_ctx=max_len, n_batch=max_len, n_ubatch=max_len if batched else 1,
                         n_threads=threads, n_threads_batch=threads, verbose=False)

    def _last_logits(self) -> np.ndarray:
        """The last evaluated token's logits (`Llama.eval` keeps them only with logits_all)."""
        import llama_cpp
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.llm.n_vocab(),))

    def generate(self, ids, new):
        llm = self.llm
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids[0].tolist())
        prefill = time.perf_counter() - start
        tokens, calls, start = [], 0, time.perf_counter()
        for i in range(new):
            token = int(np.argmax(self._last_logits()))
            tokens.append(token)
            if i == new - 1:
                break
            llm.eval([token])
            calls += 1
        return torch.tensor([tokens]), prefill, time.perf_counter() - start, calls


def build_runner(stack: str, model: LLMModel, batch: int, max_len: int, workdir: Path) -> Runner:
    if stack == "eager-fp32":
        return LMRunner(CompiledLM(lm_step(model.lm, batch, max_len), batch, max_len, padding=True))
    if stack.startswith("torchao-"):
        if not installed("torchao"):
            raise Skipped("torchao not installed: pip install torchao==0.18.0")
        return _torchao(model, batch, max_len, 8 if stack == "torchao-int8-weight" else 4)
    if stack == "ort-int4":
        return _ort_int4(model, batch, max_len, workdir)
    if stack == "openvino-nncf-int4":
        if not (installed("openvino") and installed("nncf")):
            raise Skipped("openvino or nncf not installed: pip install openvino==2026.4.1 nncf==3.4.0")
        return _openvino_int4(model, batch, max_len, workdir)
    if stack == "llama.cpp":
        if not installed("llama_cpp"):
            raise Skipped("llama_cpp not installed: pip install llama-cpp-python (built from its source distribution)")
        if batch != 1:
            raise Skipped("llama-cpp-python's Llama decodes one sequence at a time")
        if model.gguf is None:   # a random-weight config: its GGUF (Q4_0) written here
            from ..zoo.smollm2 import gguf_path
            model.gguf = write_gguf(model.lm, workdir / f"{model.name}-Q4_0.gguf", gguf_path())
        return LlamaCppRunner(model.gguf, max_len)
    if stack.startswith("qlower-"):
        from ..backends.onnxruntime import OrtOptions
        name, _, backend = stack.removeprefix("qlower-").partition("@")
        preset, _, compute = name.partition("+")
        quantize = None if preset == "fp32" else preset
        if quantize is not None and not preset_exists(quantize):
            raise Skipped(f"quantize={quantize!r} is not a preset of this qlower build")
        if backend == "openvino" and not installed("openvino"):
            raise Skipped("openvino not installed: pip install \"qlower[openvino]\"")
        if compute and backend not in ("", "onnxruntime"):
            raise ValueError(f"{stack}: '+{compute}' is an ONNX Runtime option")
        calibration = [c[:max_len] for c in model.calibration] if quantize else None
        options = OrtOptions(weight_only_compute=compute) if compute else None
        return LMRunner(compile_lm(model.lm, quantize=quantize, calibration=calibration,
                                   backend=backend or "onnxruntime", batch=batch, max_len=max_len,
                                   backend_options=options))
    raise ValueError(f"unknown LLM bench stack {stack!r}; choose from {', '.join(LLM_STACKS)}")


# ------------------------------------------------------------------------------ the run
@dataclass
class LLMResult:
    model: str
    stack: str
    batch: int
    ok: bool = True
    error: str | None = None
    skipped: bool = False                # not run here (a missing peer, no kernel for this CPU, unknown preset)
    note: str | None = None              # how the stack had to run here (e.g. llama.cpp's prompt token by token)
    prepare_s: float | None = None
    rss_mb: float | None = None          # resident memory added while building the stack
    prefill_tps: float | None = None     # tokens/s, median over rounds (batch x prompt / time)
    decode_tps: float | None = None      # tokens/s, median over rounds (batch x decode calls / time)
    decode_ms: float | None = None       # milliseconds per decode step (all rows)
    prefill_vs_eager: float | None = None    # median per-round ratio of tokens/s to eager fp32's
    decode_vs_eager: float | None = None
    floor_ms: float | None = None        # the memory-bandwidth floor of a decode step at this stack's width
    same_tokens: int | None = None       # leading generated tokens of row 0 equal to eager fp32's
    samples: list = field(default_factory=list)   # (prefill_s, decode_s) per round


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")   # torch.onnx colours its messages


def _error(exc: BaseException) -> str:
    lines = _ANSI.sub("", str(exc)).strip().splitlines() or [type(exc).__name__]
    return lines[0][:240] if isinstance(exc, Skipped) else f"{type(exc).__name__}: {lines[0][:200]}"


def run_llm(models=LLM_MODELS, stacks=LLM_STACKS, batches=(1, 4), prompt: int = 128, new: int = 128,
            rounds: int = 3, log: Callable[[str], None] = print, bandwidth_gbs: float | None = None,
            workdir: str | None = None, capture: LogCapture | None = None) -> tuple[list[LLMResult], dict]:
    """Every (model, batch) pair: build each stack, warm it up, time `rounds` interleaved rounds.
    `new` decode steps follow the prefill (so `new + 1` tokens per row are generated). What the
    stacks' libraries print or warn while they are built and run goes to `capture` (bench.log)."""
    quiet = capture if capture is not None else contextlib.nullcontext
    torch.set_num_threads(1)
    bandwidth = bandwidth_gbs if bandwidth_gbs is not None else copy_bandwidth()
    log(f"memory bandwidth (numpy copy, one thread): {bandwidth:.1f} GB/s")
    results: list[LLMResult] = []
    params_of: dict[str, int] = {}
    groups: dict[str, int] = {}
    max_len = prompt + new + 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(workdir or tmp)
        for name in models:
            with quiet():   # transformers' GGUF conversion draws progress bars
                model = build_model(name)
            params = params_of[name] = weight_params(model.lm)
            groups[name] = group_size(model.lm)
            for batch in batches:
                ids = model.prompt_ids(batch, prompt)
                runners: dict[str, Runner] = {}
                rows: dict[str, LLMResult] = {}
                for stack in stacks:
                    row = rows[stack] = LLMResult(name, stack, batch)
                    if stack_bits(stack):
                        row.floor_ms = floor_ms(params, stack_bits(stack), bandwidth, group_size(model.lm))
                    gc.collect()
                    before, start = _rss_mb(), time.perf_counter()
                    try:
                        with quiet():
                            runner = build_runner(stack, model, batch, max_len, work)
                            runner.generate(model.prompt_ids(batch, 8), 3)   # warm-up
                        runners[stack] = runner
                        row.note = getattr(runner, "note", None) or None
                    except Exception as exc:   # a row with the reason, never fatal
                        row.ok, row.error, row.skipped = False, _error(exc), isinstance(exc, Skipped)
                        log(f"  {name} b{batch} {stack}: {row.error}")
                        if not isinstance(exc, Skipped):
                            log(traceback.format_exc(limit=4))
                        continue
                    row.prepare_s, row.rss_mb = time.perf_counter() - start, _rss_mb() - before
                    log(f"  {name} b{batch} {stack}: built in {row.prepare_s:.0f} s, +{row.rss_mb:.0f} MB")
                tokens: dict[str, torch.Tensor] = {}
                order = list(runners)
                for r in range(rounds):
                    for stack in (order if r % 2 == 0 else order[::-1]):
                        with quiet():
                            out, prefill_s, decode_s, calls = runners[stack].generate(ids, new + 1)
                        rows[stack].samples.append((prefill_s, decode_s, calls))
                        tokens[stack] = out
                    log(f"  {name} b{batch} round {r + 1}/{rounds} done")
                _summarize(rows, tokens, batch, prompt)
                results += list(rows.values())
                del runners
                gc.collect()   # this batch's stacks freed before the next batch's memory is measured
    if bandwidth_gbs is None:   # again at the end: the best of both (a busy machine copies slower)
        at_end = copy_bandwidth()
        log(f"memory bandwidth at the end: {at_end:.1f} GB/s")
        if at_end > bandwidth:
            bandwidth = at_end
            for row in results:
                if stack_bits(row.stack):
                    row.floor_ms = floor_ms(params_of[row.model], stack_bits(row.stack), bandwidth, groups[row.model])
    info = machine_info()
    info.update(bandwidth_gbs=bandwidth, prompt=prompt, new=new, rounds=rounds)
    return results, info


def _summarize(rows: dict[str, LLMResult], tokens: dict[str, torch.Tensor], batch: int, prompt: int) -> None:
    eager = rows.get("eager-fp32")
    for stack, row in rows.items():
        if not row.samples:
            continue
        prefill = [batch * prompt / p for p, _, _ in row.samples]
        decode = [batch * c / d for _, d, c in row.samples]
        row.prefill_tps, row.decode_tps = statistics.median(prefill), statistics.median(decode)
        row.decode_ms = statistics.median(d / c * 1e3 for _, d, c in row.samples)
        if eager is not None and eager.samples and len(eager.samples) == len(row.samples):
            row.prefill_vs_eager = statistics.median(e[0] / p[0] for e, p in zip(eager.samples, row.samples))
            row.decode_vs_eager = statistics.median((e[1] / e[2]) / (p[1] / p[2])
                                                    for e, p in zip(eager.samples, row.samples))
        if "eager-fp32" in tokens and stack in tokens:
            want, got = tokens["eager-fp32"][0].tolist(), tokens[stack][0].tolist()
            row.same_tokens = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))


def table(results: list[LLMResult], info: dict) -> str:
    """The Markdown table of a run, with the machine and the method in its header."""
    lines = [f"Prompt {info['prompt']} tokens, {info['new']} decode steps, greedy, one thread per stack, "
             f"{info['rounds']} interleaved rounds (medians; x eager: median of per-round ratios). "
             f"Memory bandwidth (numpy copy): {info['bandwidth_gbs']:.1f} GB/s.", ""]
    lines += [f"{line}  " for line in describe(info)] + [""]
    lines += ["| model | batch | stack | prefill tok/s | x eager | decode tok/s | ms/step | x eager | floor ms/step "
              "| RSS MB | same tokens | build s |", "|" + "---|" * 12]
    for r in results:
        if not r.ok:
            lines.append(f"| {r.model} | {r.batch} | {r.stack} | {'skipped' if r.skipped else 'error'}: {r.error} |"
                         + " |" * 8)
            continue
        f = lambda v, fmt: "" if v is None else format(v, fmt)
        lines.append(f"| {r.model} | {r.batch} | {r.stack} | {f(r.prefill_tps, '.0f')} | {f(r.prefill_vs_eager, '.2f')}"
                     f" | {f(r.decode_tps, '.1f')} | {f(r.decode_ms, '.1f')} | {f(r.decode_vs_eager, '.2f')}"
                     f" | {f(r.floor_ms, '.1f')} | {f(r.rss_mb, '.0f')} | {f(r.same_tokens, 'd')} "
                     f"| {f(r.prepare_s, '.0f')} |")
    notes = [f"- {r.stack} (batch {r.batch}): {r.note}" for r in results if r.note]
    return "\n".join(lines + ([""] + notes if notes else []))


def write(results: list[LLMResult], info: dict, out: Path, command: str) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "llm.md", out / "llm.json"
    md.write_text(f"`{command}`\n\n{table(results, info)}\n")
    js.write_text(json.dumps({"command": command, "machine": info, "results": [asdict(r) for r in results]},
                             indent=1, default=str))
    return md, js


def run_suite(models=None, stacks=None, batches=None, rounds=None, out: Path = Path("bench-out"),
              log: Callable[[str], None] = print, command: str = "qlower bench --suite llm") -> list[LLMResult]:
    """What `qlower bench --suite llm` runs (SmolLM2-135M at batch 1 and 4, every stack: about
    45 minutes on a busy 2-core VM, half of it compiling qlower's presets and exporting the ONNX
    model; docs/llm.md)."""
    capture = LogCapture(Path(out) / "bench.log").open()
    try:
        results, info = run_llm(models or LLM_MODELS, stacks or LLM_STACKS, batches or (1, 4), rounds=rounds or 3,
                                log=log, capture=capture)
    finally:
        capture.close()
    md, js = write(results, info, out, command)
    log(table(results, info))
    log(f"wrote {md} and {js}")
    return results
