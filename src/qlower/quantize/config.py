"""Quantization configuration (typed, immutable)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from ..errors import QuantizeError


@dataclass(frozen=True)
class SmoothQuant:
    """SmoothQuant options. alphas: migration strengths tried per group (plus none); rows:
    calibration rows kept per group for the search, spread over the batches (the per-channel
    maxima use all rows)."""
    alphas: tuple[float, ...] = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
    rows: int = 512

    def __post_init__(self):
        if not self.alphas or not all(0.0 <= a <= 1.0 for a in self.alphas):
            raise QuantizeError(f"SmoothQuant alphas must be in [0, 1], got {self.alphas}")
        if self.rows < 1:
            raise QuantizeError(f"SmoothQuant rows must be >= 1, got {self.rows}")


@dataclass(frozen=True)
class WeightOnly:
    """Weight-only quantization (float activations; numerics.py, "weight-only linear").

    bits: 4 (W4A16) or 8 (W8A16).
    group_size: input features sharing one scale and zero point (32, 64, 128, ...); None: one
        group per output channel (the whole row).
    symmetric: zero point 2^(bits-1) and scale max|w| / (2^(bits-1) - 1); else asymmetric
        (the group's range, holding 0, over 2^bits - 1 codes, an integer zero point).
    method: "rtn" (round to nearest), "gptq" (each column's rounding error compensated on the
        columns not yet quantized, from the calibration inputs' second moments: quantize/gptq.py)
        or "awq" (activation-aware per-input-channel scales searched on the calibration inputs
        and folded into the op before: quantize/awq.py), or "awq+gptq" (both, AWQ first).
    embeddings: also quantize embedding tables and the linears that share their weight (a tied
        lm_head); default False: they stay float (a linear with its own weight, e.g. an untied
        output projection, is quantized like every other linear).
    embedding_bits: the tables' own scheme, when `embeddings`: None, that of the linears (`bits`,
        `group_size`, `symmetric`); 8, 8-bit per row, symmetric (the `int8-weight` scheme: one
        scale per token, i.e. per output channel of a tied lm_head); 4, 4-bit in groups of
        `group_size` (128 when that is None), `symmetric` as the linears. Tables always round to
        nearest (GPTQ and AWQ leave a table, and a weight shared with one, alone).
    gptq_damping: GPTQ's diagonal damping, a fraction of the mean of the Hessian's diagonal.
    awq_clip: with "awq" / "awq+gptq", also clip each group's weights to the range (a ratio in
        0.5 ... 1 of it, per output row and group) that minimizes the calibration inputs' output
        error before the codes are chosen (AWQ's auto_clip: quantize/awq.py).
    """
    bits: Literal[4, 8] = 4
    group_size: int | None = 128
    symmetric: bool = False
    method: Literal["rtn", "gptq", "awq", "awq+gptq"] = "rtn"
    embeddings: bool = False
    embedding_bits: Literal[4, 8] | None = None
    gptq_damping: float = 0.01
    awq_clip: bool = True

    def __post_init__(self):
        if self.bits not in (4, 8):
            raise QuantizeError(f"weight-only bits must be 4 or 8, got {self.bits!r}")
        if self.group_size is not None and (not isinstance(self.group_size, int) or self.group_size < 1):
            raise QuantizeError(f"group_size must be a positive int or None (per channel), got {self.group_size!r}",
                                hint="e.g. WeightOnly(bits=4, group_size=128)")
        if self.method not in ("rtn", "gptq", "awq", "awq+gptq"):
            raise QuantizeError(f"unknown weight-only method {self.method!r}",
                                hint="use 'rtn', 'gptq', 'awq' or 'awq+gptq'")
        if not 0.0 < self.gptq_damping < 1.0:
            raise QuantizeError(f"gptq_damping must be in (0, 1), got {self.gptq_damping}")
        if self.embedding_bits not in (None, 4, 8):
            raise QuantizeError(f"embedding_bits must be 4, 8 or None (as the linears), got {self.embedding_bits!r}")
        if self.embedding_bits is not None and not self.embeddings:
            raise QuantizeError("embedding_bits is the scheme of quantized embedding tables, but embeddings=False "
                                "keeps them float", hint="WeightOnly(..., embeddings=True, embedding_bits=8)")

    def table_scheme(self) -> tuple[int, int | None, bool]:
        """(bits, group_size, symmetric) of the embedding tables and the linears sharing them."""
        if self.embedding_bits is None:
            return self.bits, self.group_size, self.symmetric
        if self.embedding_bits == 8:
            return 8, None, True
        return 4, self.group_size or 128, self.symmetric

    def describe(self) -> str:
        groups = "per output channel" if self.group_size is None else f"groups of {self.group_size}"
        unclipped = " without clipping" if "awq" in self.method and not self.awq_clip else ""
        return (f"{self.bits}-bit weights ({groups}, {'symmetric' if self.symmetric else 'asymmetric'}, "
                f"{self.method}{unclipped}{self._tables()}), float activations")

    def _tables(self) -> str:
        if not self.embeddings:
            return ""
        if self.table_scheme() == (self.bits, self.group_size, self.symmetric):
            return ", embeddings too"
        bits, group, _ = self.table_scheme()
        return f", embeddings {bits}-bit {'per row' if group is None else f'in groups of {group}'}"


Observer = Literal["minmax", "histogram", "percentile", "mse"]


@dataclass(frozen=True)
class AccuracyTarget:
    """Mixed precision to a target: the quantized model's outputs on the calibration inputs must
    reach `value` in `metric` ("sqnr" in dB, or "cosine") against the float model's. Layers
    (conv/linear/matmul) are kept in float, most sensitive first, until it holds with the fewest
    float layers (quantize/mixed_precision.py). `max_float_layers` bounds the search."""
    value: float
    metric: Literal["sqnr", "cosine"] = "sqnr"
    max_float_layers: int | None = None

    def __post_init__(self):
        if self.metric not in ("sqnr", "cosine"):
            raise QuantizeError(f"target metric must be 'sqnr' or 'cosine', got {self.metric!r}")
        if self.metric == "cosine" and not -1.0 <= self.value <= 1.0:
            raise QuantizeError(f"a cosine target must be in [-1, 1], got {self.value}")
        if self.max_float_layers is not None and self.max_float_layers < 0:
            raise QuantizeError(f"max_float_layers must be >= 0, got {self.max_float_layers}")

    def met(self, measured: float) -> bool:
        return measured >= self.value

    def __str__(self) -> str:
        return f"{self.metric} >= {self.value:g}{' dB' if self.metric == 'sqnr' else ''}"


@dataclass(frozen=True)
class QuantConfig:
    """What qlower's Quantizer produces.

    activation_dtype: "uint8" (asymmetric, the default and the fast x86 path) or "int8"
        (symmetric, zero point 0).
    weight_bits: 8 -> int8 symmetric weights in [-127, 127]; 7 -> [-63, 63] (`reduce_range`:
        AVX2 without VNNI saturates 16-bit pair sums of u8*s8, 7-bit weights keep it exact).
    per_token_weight_bits: the weight width of linears whose input is quantized at run time
        (`activations="per-token"` or `"dynamic"`); None: weight_bits. ONNX Runtime's named presets on a CPU
        without VNNI set 7 / 8: its
        per-token kernel runs 8-bit weights exactly as u8 x u8, at the 7-bit kernel's speed from
        32 rows up (SmolLM2-135M, `transformer` preset: 7-bit weights cost 6.6 dB of logits SQNR).
    per_channel: per-output-channel weight scales (else per-tensor).
    observer: activation observer: "minmax", "histogram" (torchao's HistogramObserver, an
        L2-error search over a histogram), "percentile" (clips at `percentile`) or "mse" (the
        clipping range minimizing the measured quantization MSE of the calibration values,
        observers.MSEObserver).
    """
    activation_dtype: Literal["uint8", "int8"] = "uint8"
    weight_bits: Literal[7, 8] = 8
    per_token_weight_bits: Literal[7, 8] | None = None
    per_channel: bool = True
    observer: Observer = "minmax"
    percentile: float = 99.99
    # nn.Module paths (prefixes, e.g. "layers.1.fc2") whose ops stay float: the layers
    # `qlower.report.sensitivity` ranks worst, when accuracy needs it.
    keep_float: tuple[str, ...] = ()
    # Quantize elementwise multiplies at their output. ONNX Runtime has no exact integer
    # multiply, so a quantized mul runs as DQ, DQ, Mul, Q: extra rounding and nodes for nothing
    # (measured on the zoo and HF models, docs/performance.md). Off: muls run in float between
    # the quantized ops around them.
    quantize_mul: bool = False
    # Quantize adds of two tensors where one already carries qparams (residual adds). Off keeps
    # a transformer's residual stream float: real LLMs carry "massive activations" there
    # (SmolLM2-135M: a few channels near 2.4e4 while most values are below 10), and one uint8
    # scale over that range (~96) zeroes everything else (docs/accuracy.md).
    quantize_add: bool = True
    # Give conv/linear/matmul outputs activation qparams even where every consumer is a float op
    # (softmax, silu, a float residual add). Off: such an op keeps its int32 accumulator and
    # dequantizes it (scale sx*sw), skipping one rounding step, and the consumer quantizes
    # its own input if it needs one.
    requantize_outputs: bool = True
    # SmoothQuant: activation outliers migrated into the following linears' weights, strength
    # searched per layer, folded into constants (quantize/smoothquant.py). None: off.
    smoothquant: SmoothQuant | None = None
    # Bias correction: subtract each conv/linear's measured mean output shift caused by weight
    # rounding from its bias (quantize/biascorrect.py).
    bias_correction: bool = False
    # Activations of linear layers: "static" (calibrated per-tensor qparams) or "per-token"
    # (a scale per row computed at run time, numerics.per_token_scale: outliers that move with
    # the token do not clip or flatten the other tokens; costs a max-reduction per row).
    # Other ops (conv, attention matmuls, adds) keep static qparams. "dynamic": one scale and
    # zero point for the whole input, computed at run time (ONNX DynamicQuantizeLinear, the
    # scheme of ONNX Runtime's `quantize_dynamic`, numerics.dynamic_qparams): one fused kernel
    # per linear on ONNX Runtime (DynamicQuantizeMatMul), less accurate than per token.
    activations: Literal["static", "per-token", "dynamic"] = "static"
    # Quantize matmuls of two activations (attention's Q @ K^T and P @ V). Off keeps them float:
    # softmax probabilities span many decades that one uint8 scale cannot hold (docs/accuracy.md).
    quantize_activation_matmul: bool = True
    # Decompose torch's scaled_dot_product_attention into its matmuls before annotation so
    # that they are quantized too (quantize/attention.py), as an attention written with matmul
    # and softmax is: with quantize_activation_matmul the int8 program is then integer from Q·Kᵀ
    # to P·V (integer_softmax, masked too), the same bits on every backend. A float SDPA's ulps
    # differ between engines and flip the codes of the linear after it (HF BERT int8: 2.5e-3
    # between IREE and the reference). Cost on ONNX Runtime (Zen 3, one thread, batch 1):
    # hf-bert +7%, hf-vit +5%, hf-gpt2 -1% (docs/accuracy.md). Off keeps SDPA one float op (the
    # transformer presets, whose activation matmuls are float anyway). Programs that write
    # buffers (KV-cache decode steps) keep it float: torch cannot re-trace them.
    quantize_attention: bool = True
    # Operands of a matmul of two activations quantized int8-symmetric (zero point 0) instead of
    # with the activation dtype, except softmax outputs (non-negative: uint8, zero point 0). Set
    # by the OpenVINO backend's engine-native mode: its low-precision transformations make a
    # MatMul int8 only when no operand has a zero point; with uint8-asymmetric q/k/v the plugin
    # ran BERT-base's quantized attention as an f32 MHA snippet (docs/performance.md).
    symmetric_activation_matmul: bool = False
    # Mixed precision: keep the most sensitive layers float until this accuracy holds
    # (AccuracyTarget, or a number: an SQNR target in dB). None: every supported layer is int8.
    target: AccuracyTarget | None = None
    # Weight-only quantization (WeightOnly): linear weights only, activations stay float; the
    # activation fields above do not apply. None: the int8 scheme above.
    weight_only: WeightOnly | None = None

    def __post_init__(self):
        if self.weight_only is not None and not isinstance(self.weight_only, WeightOnly):
            raise QuantizeError(f"weight_only must be a WeightOnly, got {self.weight_only!r}",
                                hint="e.g. QuantConfig(weight_only=WeightOnly(bits=4, group_size=64))")
        if self.weight_only is not None and self.target is not None:
            raise QuantizeError("an accuracy target is not available with weight-only quantization")
        if isinstance(self.target, (int, float)) and not isinstance(self.target, bool):
            object.__setattr__(self, "target", AccuracyTarget(float(self.target)))
        if self.target is not None and not isinstance(self.target, AccuracyTarget):
            raise QuantizeError(f"target must be an AccuracyTarget or an SQNR in dB, got {self.target!r}",
                                hint="e.g. QuantConfig(target=AccuracyTarget(0.99, metric='cosine'))")
        if self.activation_dtype not in ("uint8", "int8"):
            raise QuantizeError(f"activation_dtype must be 'uint8' or 'int8', got {self.activation_dtype!r}")
        if self.weight_bits not in (7, 8):
            raise QuantizeError(f"weight_bits must be 7 or 8, got {self.weight_bits!r}")
        if self.per_token_weight_bits not in (None, 7, 8):
            raise QuantizeError(f"per_token_weight_bits must be 7, 8 or None, got {self.per_token_weight_bits!r}")
        if self.observer not in ("minmax", "histogram", "percentile", "mse"):
            raise QuantizeError(f"unknown observer {self.observer!r}",
                                hint="use 'minmax', 'histogram', 'percentile' or 'mse'")
        if self.activations not in ("static", "per-token", "dynamic"):
            raise QuantizeError(f"activations must be 'static', 'per-token' or 'dynamic', got {self.activations!r}")
        if not 50.0 < self.percentile <= 100.0:
            raise QuantizeError(f"percentile must be in (50, 100], got {self.percentile}")

    @property
    def run_time_activations(self) -> bool:
        """Linear inputs are quantized at run time (per token or per tensor), not calibrated."""
        return self.activations in ("per-token", "dynamic")

    @property
    def linear_weight_bits(self) -> int:
        """The weight width of linear layers: run-time quantized ones may differ from the rest."""
        if self.run_time_activations and self.per_token_weight_bits is not None:
            return self.per_token_weight_bits
        return self.weight_bits

    def describe_weights(self) -> str:
        """'8-bit weights', or '7-bit weights (8-bit in per-token linears)'."""
        if self.weight_only is not None:
            return self.weight_only.describe()
        if self.linear_weight_bits == self.weight_bits:
            return f"{self.weight_bits}-bit weights"
        return f"{self.weight_bits}-bit weights ({self.linear_weight_bits}-bit in {self.activations} linears)"

    @staticmethod
    def from_name(name: str) -> "QuantConfig":
        presets = {"int8": QuantConfig(), "uint8": QuantConfig(),
                   # transformers: per-token linear inputs; histogram (MSE-searched) ranges for
                   # the static rest (zoo ViT 27.4 vs 26.5 dB minmax, docs/performance.md); float
                   # residual stream and float outputs of linears that feed float ops;
                   # SmoothQuant. SmolLM2-135M (docs/accuracy.md): next-token top-1 vs fp32
                   # 0% (int8) -> 68.4% (static) -> 85.9% (per-token); zoo transformers +0.7 to
                   # +3.6 dB over static. Costs 1.15x latency on hf-llama-base (onnxruntime).
                   # Attention's matmuls stay float, as they do inside torch's SDPA: on the zoo
                   # transformers with explicit attention (decoder, transformer, bert, vit; batch
                   # 1, onnxruntime, one thread) float matmuls were 5-7% faster and 0.7-3.6 dB
                   # more accurate (docs/accuracy.md).
                   "transformer": QuantConfig(observer="histogram", quantize_add=False, quantize_attention=False,
                                              activations="per-token",
                                              requantize_outputs=False, smoothquant=SmoothQuant(),
                                              quantize_activation_matmul=False),
                   # the static form of the above: faster (no per-row max / division), less accurate
                   "transformer-static": QuantConfig(observer="histogram", quantize_add=False, quantize_attention=False,
                                                     requantize_outputs=False, smoothquant=SmoothQuant(),
                                                     quantize_activation_matmul=False),
                   # ONNX Runtime's dynamic scheme (one range per linear input, computed at run
                   # time) with the rest as above: as fast as ORT's own `quantize_dynamic` model
                   # (one DynamicQuantizeMatMul per linear), bit-exact with the reference backend
                   "transformer-dynamic": QuantConfig(observer="histogram", quantize_add=False,
                                                      quantize_attention=False,
                                                      activations="dynamic", requantize_outputs=False,
                                                      smoothquant=SmoothQuant(), quantize_activation_matmul=False),
                   "int8-symmetric": QuantConfig(activation_dtype="int8"),
                   # weight-only (docs/llm.md): W4A16 in asymmetric groups of 128 with AWQ-style
                   # scaling and clipping (SmolLM2-135M, held-out perplexity vs fp32: +18.1%; GPTQ
                   # +26.6%, round to nearest +26.7%), its embedding table and tied lm_head 8-bit
                   # per row (llama.cpp's Q8_0 for token_embd in this model's GGUF; +0.2 points of
                   # perplexity, where a 4-bit table costs +21.8: the head read at 8 bits, not 32,
                   # every decode step); and W8A16 per output channel, embeddings (and a tied
                   # lm_head) float
                   "int4-weight": QuantConfig(weight_only=WeightOnly(bits=4, group_size=128, method="awq",
                                                                     embeddings=True, embedding_bits=8)),
                   "int8-weight": QuantConfig(weight_only=WeightOnly(bits=8, group_size=None, symmetric=True)),
                   "int8-7bit-weights": QuantConfig(weight_bits=7)}
        if name not in presets:
            raise QuantizeError(f"unknown quantization preset {name!r}", hint=f"use one of {sorted(presets)}")
        return presets[name]


def config_code(config: QuantConfig) -> str:
    """The Python expression that builds `config` (its fields that differ from the defaults)."""
    default = QuantConfig()
    parts = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if value != getattr(default, f.name):
            parts.append(f"{f.name}={'SmoothQuant()' if type(value).__name__ == 'SmoothQuant' else repr(value)}")
    return f"QuantConfig({', '.join(parts)})"
