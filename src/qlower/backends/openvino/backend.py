"""The openvino backend: clusters of supported nodes are translated to ONNX by qlower's
translator (`onnxruntime.translate.translate_cluster`, standard ONNX ops only: no ONNX Runtime
contrib kernels, no FuseRequantize) and compiled by OpenVINO's CPU plugin; everything else runs
in PyTorch. A cluster that fails to translate/compile, or raises at run time, falls back to
PyTorch with the reason in the report (logged once on `qlower.openvino`).

Numerics, two profiles (OvOptions.numerics):
- "canonical" (default): qlower's integer ops, rewritten by onnx/exact_forms.py into formulations
  measured bit-exact against the reference backend (docs/openvino.md); ops OpenVINO does not
  reproduce bit for bit are refused in the capability and run in PyTorch. OpenVINO computes
  ConvInteger/MatMulInteger with float arithmetic: exact, not fast.
- "openvino" (engine-native): the quantized program stays in Q/DQ form (`pipeline` drops
  LowerPerTokenLinear and LowerQDQ) and goes to OpenVINO as QuantizeLinear/DequantizeLinear
  around float ops, which its low-precision transformations turn into u8 x s8 int8 kernels
  (measured on the MiniLM-size encoder: every linear layer runs as u8; 3-4x faster than
  canonical). The arithmetic (requantization, rounding) is OpenVINO's, not canonical: the
  report says so, with how many GEMM layers run in int8."""
from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass

import torch
from torch.fx import GraphModule

from ...errors import BackendError
from ...core.types import ClusterInfo
from ...core.cache import LRUCache
from ...passes.scatter_into_neutral import ScatterIntoNeutral
from ..base import Executable, decompose_unsupported_block_ops, op_counts
from ..input_sums import with_input_sums
from .int64_bounds import RangeCheck
from ..argument_checks import ArgumentCheck
from ..clusters import (compile_isolating_rejected, float_inputs, install_constant, pytorch_infos, scalar_kinds,
                        split_inputs)
from .capability import NATIVE_DEVIATION, NUMERICS, openvino_capability
from ...onnx.exact_forms import ieee_softmax, legalize
from .pow2_scales import snap_to_power_of_two
from ...passes.openvino.split_accumulation import SplitAccumulation
from ...onnx.translate import fx_nodes_of, translate_cluster
from .runner import INSTALL_HINT, OvCluster, compile_onnx, error_summary, feed_positions, gemm_precisions, log, core
from ...onnx.lowering.onnx_ops import standard_onnx_only
from ...passes import (IntegerLayerNorm, IntegerRMSNorm, IntegerSoftmax, LowerDynamicLinear, LowerPerTokenLinear,
                       LowerQDQ)

_SCALAR_DTYPE = {int: torch.int64, bool: torch.bool, float: torch.float64}
# bounded (QLOWER_MEMORY_CACHE_ENTRIES): sha256(onnx) + config -> CompiledModel (shared by equal clusters)
_COMPILED = LRUCache()


@dataclass(frozen=True)
class OvOptions:
    """How clusters are compiled by the CPU plugin.

    inference_precision "f32": OpenVINO's CPU plugin otherwise picks bf16 on CPUs with bf16
    support, which is not fp32 numerics. performance_hint LATENCY with one stream: batch-1
    latency is what qlower measures."""
    threads: int = 0                       # 0: torch.get_num_threads()
    inference_precision: str = "f32"
    performance_hint: str = "LATENCY"
    min_cluster_size: int = 1
    # "canonical": only ops measured bit-exact against the reference kernels run in OpenVINO
    # (quantize with a non-power-of-two scale runs in PyTorch). "openvino": the engine-native
    # profile: the Q/DQ program runs on OpenVINO's int8 kernels with its own arithmetic; the
    # report says so (capability.NATIVE_DEVIATION). Never chosen unless asked for.
    numerics: str = "canonical"

    @property
    def native(self) -> bool:
        return self.numerics == "openvino"

    def config(self) -> dict:
        return {"INFERENCE_PRECISION_HINT": self.inference_precision,
                "PERFORMANCE_HINT": self.performance_hint,
                "INFERENCE_NUM_THREADS": self.threads or torch.get_num_threads(),
                "NUM_STREAMS": 1}


def translate(sub: GraphModule, constants: dict[str, torch.Tensor], exact: bool = True) -> bytes:
    """The cluster as ONNX bytes: standard ONNX ops only (qlower's translator), then, when
    `exact`, rewritten into the formulations OpenVINO computes exactly (onnx/exact_forms.py). The
    engine-native profile skips the rewrite: its DequantizeLinear -> Cast/Sub/Cast/Mul hides the
    Q/DQ pattern from OpenVINO's low-precision transformations (measured on the MiniLM-size
    encoder in Q/DQ form: 6.3 ms with the rewrite, 2.1 ms without, 2 threads)."""
    import onnx.inliner
    with standard_onnx_only():
        model = translate_cluster(sub, constants)
    # OpenVINO's ONNX frontend has no conversion rule for model-local functions (measured: "No
    # conversion rule found for operations: qlower.group_norm"): block ops are inlined here.
    model = onnx.inliner.inline_local_functions(model)
    if exact:
        legalize(model)
    ieee_softmax(model)
    return model.SerializeToString()


class OpenVinoBackend:
    name = "openvino"
    install_hint = INSTALL_HINT

    def __init__(self, options: OvOptions | None = None):
        self.options = options or OvOptions()
        if self.options.numerics not in NUMERICS:
            raise BackendError(f"unknown OvOptions.numerics {self.options.numerics!r}", hint=f"use one of {NUMERICS}")
        self.capability = openvino_capability(self.options.numerics)

    def quant_config(self, config, preset: bool):
        """Named presets quantize linear inputs statically here: OpenVINO does not reproduce the
        run-time (per-token, dynamic) quantization ops (capability.py), which would leave every
        linear's input in PyTorch."""
        notes = []
        if preset and config.run_time_activations:
            notes.append(f"static activations: OpenVINO does not compute {config.activations} quantization canonically")
            config = dataclasses.replace(config, activations="static")
        if preset and self.options.native and not (config.quantize_activation_matmul and config.quantize_attention
                                                   and config.symmetric_activation_matmul):
            # measured (MiniLM-size encoder, seq 128, batch 8): fp32 attention matmuls were the
            # whole gap to NNCF, which runs them in int8 (quantize/attention.py); the canonical
            # presets keep them float (ONNX Runtime has no fused int8 batched matmul). With
            # uint8-asymmetric q/k/v the plugin fused BERT-base's attention into an f32 MHA
            # snippet (8.4 ms of 39 ms on an AMX Xeon); int8-symmetric operands (zero point 0,
            # what its low-precision transformations accept) make it an int8 one (3.6 ms,
            # 36.7 ms in all; NNCF 35.2; per-layer profile, docs/performance.md).
            config = dataclasses.replace(config, quantize_attention=True, quantize_activation_matmul=True,
                                         symmetric_activation_matmul=True)
            notes.append("attention matmuls quantized for OpenVINO (int8-symmetric q, k, v; uint8 softmax output)")
        return config, "; ".join(notes) or None

    def pipeline(self, passes: list) -> list:
        """Engine-native numerics keep the quantized program in Q/DQ form for OpenVINO's own
        int8 lowering (no qlower integer ops); canonical numerics run the default pipeline."""
        if not self.options.native:
            return passes
        return [p for p in passes if not isinstance(p, (LowerPerTokenLinear, LowerDynamicLinear, LowerQDQ,
                                                        IntegerLayerNorm, IntegerRMSNorm, IntegerSoftmax))]

    def adjust_observers(self, observed) -> None:
        """Canonical numerics: power-of-two activation scales, which OpenVINO quantizes exactly
        (pow2_scales.py); engine-native numerics keep the calibrated scales."""
        if self.options.numerics == "canonical":
            snap_to_power_of_two(observed)

    def legalize_passes(self) -> list:
        """Block ops the CPU plugin lacks, decomposed; canonical numerics: linears whose fp32
        accumulation could round split over their input features (split_accumulation.py); a
        scatter "mean" as sums into zeros (the plugin's mean was wrong). Its ONNX-level rewrites
        are onnx/exact_forms.py's."""
        passes = [decompose_unsupported_block_ops(self.capability), ScatterIntoNeutral(frozenset({"mean"}))]
        return passes if self.options.native else passes + [SplitAccumulation()]

    def available(self) -> bool:
        try:
            import openvino  # noqa: F401
        except ImportError:
            return False
        return True

    def _compiled(self, model_bytes: bytes):
        config = self.options.config()
        key = hashlib.sha256(model_bytes).hexdigest() + repr(sorted(config.items()))
        compiled = _COMPILED.get(key)
        if compiled is None:
            compiled = _COMPILED[key] = compile_onnx(model_bytes, config)
        return compiled

    def compile(self, gm: GraphModule) -> Executable:
        """Cluster, translate, compile per cluster. A cluster the CPU plugin refuses where its
        error names the ONNX node (or op type) it could not take is compiled again without the
        ATen op behind it (`rejected_nodes`): that op alone runs in PyTorch
        (`clusters.compile_isolating_rejected`, shared with onnxruntime)."""
        core()   # BackendError with the install hint when openvino is missing
        notes = []
        fused, clustering, infos = compile_isolating_rejected(gm, self.capability, self.options.min_cluster_size,
                                                              self._compile_cluster, log)
        fused.graph.eliminate_dead_code()
        fused.recompile()
        infos += pytorch_infos(clustering.unsupported, fused, len(infos))
        import openvino as ov
        notes.append(f"openvino {ov.__version__}: CPU plugin, inference precision {self.options.inference_precision}, "
                     f"numerics {self.options.numerics!r}")
        notes += self._precision_notes(fused, infos)
        return Executable(run=fused, clusters=infos, module=fused, notes=notes)

    def _precision_notes(self, fused: GraphModule, infos: list[ClusterInfo]) -> list[str]:
        """What the CPU plugin runs the GEMM layers in, and the engine-native declaration."""
        counts: dict[str, int] = {}
        for module in fused.children():
            if isinstance(module, OvCluster) and module.compiled is not None:
                for precision, n in gemm_precisions(module.compiled).items():
                    counts[precision] = counts.get(precision, 0) + n
        notes = [f"OpenVINO runs {sum(counts.values())} conv/linear/matmul layer(s): " +
                 ", ".join(f"{n} in {p}" for p, n in sorted(counts.items()))] if counts else []
        quantizes = sum(c.ops.get("qlower::quantize", 0) for c in infos
                        if c.backend == self.name and c.status == "compiled")
        if self.options.native and quantizes:
            notes.append(f"engine-native numerics (not canonical): {NATIVE_DEVIATION}")
        return notes

    def _compile_cluster(self, fused: GraphModule, call, index: int, mutated: set[str],
                         rejected: dict[str, str] | None = None) -> ClusterInfo:
        sub: GraphModule = getattr(fused, call.target)
        inputs = split_inputs(fused, call, mutated)
        constants = inputs.constants
        info = ClusterInfo(index, self.name, sum(1 for n in sub.graph.nodes if n.op == "call_function"),
                           op_counts(sub))
        out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
        single = not isinstance(out, (tuple, list))
        if not inputs.runtime_args:  # constants only: evaluate once, no engine call
            install_constant(fused, call, inputs, info)
            return info
        outs = [out] if single else list(out)
        # a scalar output (`item()`, a size check) comes back from OpenVINO as a 0-d tensor
        dtypes = [o.meta["val"].dtype if isinstance(o.meta.get("val"), torch.Tensor)
                  else _SCALAR_DTYPE[scalar_kinds(sub)[k]] for k, o in enumerate(outs)]
        checks = float_inputs(fused, inputs.runtime_args)
        model_bytes = None
        try:
            model_bytes = translate(sub, constants, exact=not self.options.native)
            info.onnx = model_bytes
            # the input sums inside the model (measured: numpy's sums after each call cost the
            # zoo CNN and transformer 13-15% at batch 1, one thread)
            compiled = self._compiled(with_input_sums(model_bytes, list(checks)) if checks else model_bytes)
            feed = feed_positions(model_bytes, compiled)
        except Exception as exc:  # translate or compile failed: this cluster runs in PyTorch
            info.status, info.reason = "fallback", f"compile failed: {error_summary(exc)}"
            compiled, feed = None, None   # (the warning: compile(), once the clusters are final)
            if rejected is not None and model_bytes is not None:
                rejected.update(rejected_nodes(exc, model_bytes, sub))
        range_check = RangeCheck(sub, inputs.by_position)
        argument_check = ArgumentCheck(sub, inputs.by_position)
        setattr(fused, call.target, OvCluster(sub, compiled, inputs.by_position, inputs.arity, dtypes, single, info,
                                              feed, checks, range_check if range_check.needed else None,
                                              argument_check if argument_check.needed else None))
        call.args = tuple(inputs.runtime_args)
        return info


# The CPU plugin's ONNX frontend names what it cannot take: "While validating ONNX node
# '<Node(GridSample): node_grid_sampler_2d>'", or only op types: "No conversion rule found for
# operations: SequenceMap-23, util::SequenceAt" (measured over the OpInfo sweep:
# 29 cluster failures, most of them naming one).
_VALIDATING = re.compile(r"While validating ONNX node '<Node\((\w+)\): ([^>]*)>'")
_NO_RULE = re.compile(r"No conversion rule found for operations: ([^\n]*?)(?: To facilitate|$)")


def rejected_nodes(exc: BaseException, model_bytes: bytes, sub: GraphModule) -> dict[str, str]:
    """FX node name -> reason, for the nodes behind the ONNX node (or op types) a failed
    OpenVINO compile names."""
    error = str(exc)
    why = f"OpenVINO's CPU plugin rejects its translation: {error_summary(exc, 160)}"
    m = _VALIDATING.search(error)
    if m is not None:
        return {n: why for n in fx_nodes_of(model_bytes, m.group(2), m.group(1), sub)}
    m = _NO_RULE.search(error)
    if m is None:
        return {}
    op_types = {t.strip().rsplit("-", 1)[0] for t in m.group(1).split(",") if "::" not in t}
    return {n: why for op_type in op_types for n in fx_nodes_of(model_bytes, "", op_type, sub)}
