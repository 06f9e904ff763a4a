"""The onnxruntime backend: clusters of supported nodes become ONNX models run by ONNX Runtime
sessions; everything else runs in PyTorch (the reference kernels). A cluster that fails to
emit/compile, or raises at run time, falls back to PyTorch with the reason recorded."""
from __future__ import annotations

import functools
import hashlib
import logging
import math
import operator
import re
import dataclasses
from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node

from ...fx import node_tensors
from ...core.settings import settings
from ...core.types import ClusterInfo
from ...errors import BackendError
from ...passes.scatter_into_neutral import ScatterIntoNeutral
from ..base import Executable, InputsRefused, decompose_unsupported_block_ops, op_counts
from ..clusters import (as_numpy, as_scalars, compile_isolating_rejected, float_inputs, install_constant,
                        maps_float_to_integers, nonfinite_positions, policy_inputs, pytorch_graph, pytorch_infos,
                        run_in_pytorch, scalar_kinds, split_inputs, tell_policy, worst_abs_diff)
from ..input_sums import with_input_sums
from ...onnx.bfloat16_values import as_bfloat16, as_float32, bfloat16_positions
from ...core import cache, cpu
from ...onnx.capability import PARTLY_COVERED_DTYPES, onnxruntime_capability
from ...passes.onnxruntime.write_out_training_batch_norm import WriteOutTrainingBatchNorm
from ...passes.onnxruntime.replace_alias_ops import ReplaceAliasOps
from ...passes.onnxruntime.write_out_embedding_renorm import WriteOutEmbeddingRenorm
from ...passes.onnxruntime.write_out_reduction_dims import WriteOutReductionDims
from ...passes.onnxruntime.unsqueeze_attention_to_4d import UnsqueezeAttentionTo4d
from ...passes.onnxruntime.fuse_dequantize import FuseDequantize
from ...passes.onnxruntime.fuse_per_token import FusePerTokenLinear
from ...passes.onnxruntime.fuse_requantize import FuseRequantize
from .snap_scales import snap_add_scales
from .bound_state import BoundState, StateSlot, bind_state
from ...onnx.translate import fx_nodes_of, target_text, translate_cluster
from ...onnx.standard import translate_standard
from ...onnx.exact_forms import legalize
from ...onnx.lowering.weight_only import COMPUTE_LEVELS, weight_only_compute
from .export import export_onnx

log = logging.getLogger("qlower.onnxruntime")
_SESSIONS = cache.LRUCache()   # cluster key -> session (bounded: QLOWER_MEMORY_CACHE_ENTRIES)
_MODELS = cache.LRUCache()     # cluster key -> translated ONNX model (for export)


@dataclass(frozen=True)
class OrtOptions:
    threads: int = 0                      # 0: torch.get_num_threads()
    # "all" with the QDQ re-fusions disabled: ORT's layout (NHWC) and float-op optimizations run,
    # but DQ->op->Q is never re-fused into QLinearAdd & co., whose rounding differs from the
    # canonical numerics (measured: plain "all" changes outputs; the bit-exact tests guard this).
    optimization: str = "all"            # disabled | basic | extended | all
    # QDQ propagation / unique-DQ duplication only add Q->DQ pairs around shape ops here
    # (measured: 130 -> 110 nodes on the zoo transformer, outputs identical).
    # MatMulIntegerToFloatFusion folds MatMulInteger -> Cast -> Mul(scale) into one kernel that
    # reads only the FIRST element of the scale: a per-token linear (scale per row, qlower's
    # numerics.dequantize_per_token_accumulator) came out wrong by up to 0.15 with it on, and
    # bit-exact with it off (tests/test_per_token.py::test_ort_fusion_with_row_scales_stays_off).
    # SkipLayerNormFusion folds Add (+ bias Add) + LayerNormalization into SkipLayerNormalization,
    # whose CPU kernel is ~8x slower than the LayerNormalization + Add it replaces (ORT 1.31, 1
    # thread, AMD EPYC Zen 4: 0.26 vs 0.03 ms per MiniLM-s128 layer norm; the whole model 14% faster
    # without it, fp32 7%, ORT's own dynamic int8 model 14%). Float ops only; no integer op changes.
    # MatMulScaleFusion folds a Mul/Div by a constant into FusedMatMul's alpha, a float32
    # attribute: a float64 (x @ x) / 7 came out 4.5e-8 relative off (float32's precision, where
    # float64 gives 1e-16), and a
    # float32 one rounds as x·(1/7) instead of eager's division.
    disabled_optimizers: tuple[str, ...] = ("QDQSelectorActionTransformer", "QDQPropagationTransformer",
                                            "EnsureUniqueDQForNodeUnit", "MatMulIntegerToFloatFusion",
                                            "SkipLayerNormFusion", "MatMulScaleFusion")
    min_cluster_size: int = 1
    # Weight-only linears (MatMulNBits' compute type): "fp32" (float activations, within float
    # rounding of the reference: the reordered-sum profile, docs/llm.md) or "int8" (ONNX Runtime
    # quantizes each block of activations to int8 and runs its integer GEMM: its own numerics,
    # declared non-canonical; measured 3.4x faster per 4-bit GEMM at batch 1 on an AVX-512
    # VNNI Xeon, and the only fast 8-bit kernel: its fp32 8-bit path dequantizes every call).
    weight_only_compute: str = "fp32"


def _session(model_bytes: bytes, opts: OrtOptions, key: str | None = None):
    import onnxruntime as ort
    key = key or hashlib.sha256(model_bytes).hexdigest() + f"|{ort.__version__}|{opts}"
    session = _SESSIONS.get(key)
    if session is None:
        so = ort.SessionOptions()
        so.intra_op_num_threads = opts.threads or torch.get_num_threads()
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        so.graph_optimization_level = {
            "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[opts.optimization]
        session = _inference_session(ort, model_bytes, so, opts.disabled_optimizers)
        _SESSIONS[key] = session
    return session   # not _SESSIONS[key]: the LRU may already have evicted it


# ORT 1.31's MatMulScaleFusion (a scalar Mul folded into a MatMul's alpha), run after
# MatmulTransposeFusion, deletes a scalar Mul whose output another MatMul still reads:
# y = x*0.5; (y*0 @ yT) @ y -> "Invalid model. Node input 'y' is not a graph input, initializer, or
# output of a previous node" (found by the onnxruntime fuzz run; either fusion
# alone is fine). Which graphs trip it is ORT's internal business, so the session is retried once
# without that fusion; the model runs as translated, its float ops unfused.
_RETRY_WITHOUT = ("MatMulScaleFusion",)


def _inference_session(ort, model_bytes: bytes, so, disabled: tuple[str, ...]):
    try:
        return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=list(disabled))
    except Exception as exc:   # noqa: BLE001  (re-raised below unless the retry applies)
        retry = tuple(name for name in _RETRY_WITHOUT if name not in disabled)
        if not retry or "Invalid model" not in str(exc):
            raise
        log.debug("ONNX Runtime rejected its own optimized graph (%s); retrying without %s", exc, retry)
        return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=list(disabled + retry))


_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\((\d+)\) node with name '([^']*)'")
_MAX_KERNEL_REFUSALS = 64   # nodes; then the clusters left failing fall back whole, with their reason


# ONNX Runtime naming the node it rejected at session creation ("Node (node_einsum) Op (Einsum)
# [ShapeInferenceError] ...", "... of operator (X) in node (node_y)"), and torch.onnx naming the
# FX node whose translation raised ("Error when translating node %cat : ... target=torch.ops...")
_ORT_NODE = re.compile(r"Node \(([^)]*)\) Op \((\w+)\)|of operator \((\w+)\) in node \(([^)]*)\)")
_TRANSLATING = re.compile(r"Error when translating node %\w+ : .*?target=([\w.]+)")


def _rejected_nodes(exc: BaseException, model_bytes: bytes | None, sub: GraphModule) -> dict[str, str]:
    """FX node name -> reason, for the nodes a failed cluster compile names: a kernel ONNX Runtime
    lacks (`_nodes_without_kernels`), a node its session creation rejected, or the op whose
    translation raised. Refused, they run alone in PyTorch and the rest of the cluster compiles
    (measured: one einsum with a broadcast ellipsis, which ONNX Runtime's shape inference
    rejects, took a 5-node cluster of linears to PyTorch)."""
    error = str(exc)
    if model_bytes is not None:
        found = _nodes_without_kernels(error, model_bytes, sub)
        if found:
            return found
        m = _ORT_NODE.search(error)
        if m is not None:
            name, op_type = (m.group(1), m.group(2)) if m.group(2) else (m.group(4), m.group(3))
            why = f"ONNX Runtime rejects its translation: {error.splitlines()[0][:160]}"
            return {n: why for n in fx_nodes_of(model_bytes, name, op_type, sub)}
        return {}
    chain = exc
    while chain is not None:
        m = _TRANSLATING.search(str(chain))
        if m is not None:
            why = f"torch.onnx fails to translate it: {_innermost(exc)[:160]}"
            return {n.name: why for n in sub.graph.nodes
                    if n.op == "call_function" and target_text(n.target) == m.group(1)}
        chain = chain.__cause__
    return {}


def _innermost(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _nodes_without_kernels(error: str, model_bytes: bytes, sub: GraphModule) -> dict[str, str]:
    """FX node name -> reason, when ONNX Runtime refused a session for want of a CPU kernel for
    one ONNX node: the ATen op that node was translated from (torch.onnx's `pkg.torch.onnx.fx_node`
    metadata; an onnxscript rewrite keeps the metadata of a node it folded, e.g. a batch norm
    into the conv) is refused at every node of the cluster that calls it."""
    m = _NO_KERNEL.search(error)
    if m is None:
        return {}
    op_type, name = m.group(1), m.group(3)
    why = f"ONNX Runtime has no CPU kernel for {op_type} (opset {m.group(2)}) at these types"
    found = {n: why for n in fx_nodes_of(model_bytes, name, op_type, sub)}
    calls = [n for n in sub.graph.nodes if n.op == "call_function"]
    # a node inside an op's own function body (Gelu's Erf) names no FX node: the kernels ONNX
    # Runtime lacks are for float64 / float16 / int16, so those nodes leave the cluster
    unnamed = (f"ONNX Runtime had no CPU kernel for {op_type} (opset {m.group(2)}) in this node's cluster, for a node "
           "it does not name: the cluster's float64 / float16 / int16 nodes run in PyTorch")
    return found or {n.name: unnamed for n in calls if _touches_a_partly_covered_dtype(n)}


def _touches_a_partly_covered_dtype(node) -> bool:
    """The node reads or makes a tensor of a dtype ONNX Runtime's CPU kernels cover only in part."""
    return any(t.dtype in PARTLY_COVERED_DTYPES for t in node_tensors(node))


# the session input type a numpy array of each dtype binds to (OrtCluster.validating_run)
_ONNX_TYPE = {torch.float32: "tensor(float)", torch.float64: "tensor(double)", torch.float16: "tensor(float16)",
              torch.int8: "tensor(int8)", torch.uint8: "tensor(uint8)", torch.int16: "tensor(int16)",
              torch.int32: "tensor(int32)", torch.int64: "tensor(int64)", torch.bool: "tensor(bool)"}


class OrtCluster(torch.nn.Module):
    """Runs one cluster in ONNX Runtime; falls back to its PyTorch graph if a run fails.
    Called with the cluster's runtime inputs only: its constants are bound here (in the ONNX
    model as initializers, and in `constants` for the PyTorch fallback), so the outer graph does
    not pass dozens of weight tensors on every call."""

    def __init__(self, fallback: GraphModule, session, input_names: list[str], constants: dict[int, torch.Tensor],
                 arity: int, single_output: bool, info: ClusterInfo, finite_checks: dict[int, str] | None = None):
        super().__init__()
        self.fallback = fallback   # what the engine was given
        self.in_pytorch = pytorch_graph(fallback)   # block ops an engine lacked called again
        self.session = session
        self.input_names = input_names
        self.constants = constants
        self.arity = arity
        self.single_output = single_output
        self.info = info
        self.check = settings().check_clusters
        # runtime position -> graph input name (None: not a graph input): float32 inputs whose
        # sums the session also returns, added up in one last output (input_sums.py); NaN/inf
        # in one runs the call in PyTorch (clusters.float_inputs says why)
        self.finite_checks = finite_checks or {}
        outputs = [o.name for o in session.get_outputs()] if session is not None else []
        has_sums = session is not None and bool(self.finite_checks)
        self.n_outputs = len(outputs) - (1 if has_sums else 0)
        self.output_names = outputs or None
        self.scalar_kinds = scalar_kinds(fallback)
        self.bfloat16_inputs, self.bfloat16_outputs = bfloat16_positions(fallback, constants)
        self.on_nonfinite = None   # handler(name, tensor), installed by the CompiledModule
        self.bound: BoundState | None = None   # module state the session writes (bound_state.py)

    @property
    def session(self):
        return self._session

    @session.setter
    def session(self, session) -> None:
        self._session = session
        # The pybind-level session's run skips the Python wrapper's per-call validation of names and
        # ownership (~7 us): qlower built the feed from the session's own input names.
        self._run = getattr(session, "_sess", session).run if session is not None else None

    def _full_args(self, runtime_args) -> list:
        it = iter(runtime_args)
        return [self.constants[i] if i in self.constants else next(it) for i in range(self.arity)]

    def _pytorch(self, runtime_args):
        return run_in_pytorch(self.in_pytorch, self._full_args(runtime_args))

    def can_bind_state(self) -> bool:
        """Whether the session can write module state itself (bound_state.py): a session, outputs
        taken as they come (no comparison run, no bfloat16 or scalar conversions)."""
        return self.session is not None and not self.check and not self.single_output \
            and not self.bfloat16_inputs and not self.bfloat16_outputs and self.scalar_kinds is None

    def bind_state(self, slots: list[StateSlot]) -> None:
        self.bound = BoundState(self.session._sess, self.input_names, self.output_names, slots)

    def forward(self, *args):
        session, bound = self.session, self.bound
        if session is None:
            self._check_finite_in_pytorch(args)
            return self._in_pytorch(args, self._pytorch)
        try:
            if bound is not None:
                outs = bound.run(args)
            else:
                feed = args if not self.bfloat16_inputs else as_float32(args, self.bfloat16_inputs)
                outs = self._run(self.output_names, {n: as_numpy(a) for n, a in zip(self.input_names, feed)}, None)
        except Exception as exc:  # any runtime failure: record, warn once, use PyTorch from now on
            self.session = None
            self.info.status, self.info.reason = "fallback", f"run failed: {str(exc).splitlines()[0][:200]}"
            log.warning("cluster #%d fell back to PyTorch: %s", self.info.id, self.info.reason)
            self._check_finite_in_pytorch(args)
            return self._in_pytorch(args, self._pytorch)
        if self.finite_checks:
            bad = nonfinite_positions(args, self.finite_checks, outs[self.n_outputs:])
            if bad:
                return self._in_pytorch(args, lambda a: self._nonfinite_call(a, bad))
            outs = outs[:self.n_outputs]
        if bound is not None:
            bound.commit()
            result = tuple(o if isinstance(o, torch.Tensor) else torch.from_numpy(o) for o in outs)
        else:
            result = torch.from_numpy(outs[0]) if self.single_output else tuple(map(torch.from_numpy, outs))
        if self.bfloat16_outputs:
            result = as_bfloat16(result, self.bfloat16_outputs, self.single_output)
        if self.scalar_kinds is not None:
            result = as_scalars(result, self.scalar_kinds, self.single_output)
        if self.check:
            self._compare(result, self._pytorch(args))
        return result

    def _in_pytorch(self, args, run):
        """`run(args)` (the cluster in PyTorch); the module state the session would have written
        is written into the current buffers."""
        result = run(args)
        if self.bound is not None:
            self.bound.write_in_place(args, result)
        return result

    def validating_run(self, gm: GraphModule, order: list[int]):
        """`run_validated`, returning the cluster's outputs in `order` (the model's), where the
        session's own input validation equals the input specs' check for a flat call of `gm`'s
        inputs: a plain cluster (no bfloat16 or scalar conversions, no comparison run)
        whose session inputs have every placeholder's dtype and all its dims, static. ONNX
        Runtime refuses another dtype, rank or static dim (INVALID_ARGUMENT) and copies a
        non-contiguous array; the bounds of a dynamic dim are not its to check. None otherwise."""
        if self.session is None or self.check or self.bound is not None \
                or self.bfloat16_inputs or self.bfloat16_outputs or self.scalar_kinds is not None:
            return None
        vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
        inputs = self.session.get_inputs()
        if len(vals) != len(inputs) or not all(
                isinstance(v, torch.Tensor) and _ONNX_TYPE.get(v.dtype) == i.type
                and list(i.shape) == list(v.shape) and all(isinstance(d, int) for d in i.shape)
                for v, i in zip(vals, inputs)):
            return None
        names = self.output_names
        self._validated_outputs = [names[i] for i in order] + names[self.n_outputs:]
        return self.run_validated

    def run_validated(self, args: tuple):
        """The whole call for CompiledModule (Executable.validating_run): ONNX Runtime checks
        the inputs; any refusal (or failure) raises InputsRefused, and the general path checks
        them and runs `forward`. Measured on the zoo LSTM (3 inputs, one thread, AMD EPYC Zen 1):
        Python-side shape and dtype checks after a run cost 6.5 us, `as_numpy`'s 2.8 us."""
        names = self.input_names
        if len(args) != len(names) or self._run is None:   # (None: the cluster fell back)
            raise InputsRefused
        try:
            outs = self._run(self._validated_outputs, {n: a.numpy() for n, a in zip(names, args)}, None)
        except Exception as exc:  # noqa: BLE001  (a non-tensor, a tensor needing grad, a refused input)
            raise InputsRefused from exc
        if self.finite_checks:
            if not math.isfinite(outs[self.n_outputs]):
                bad = nonfinite_positions(args, self.finite_checks, outs[self.n_outputs:])
                if bad:
                    raise InputsRefused   # the general path runs this call in PyTorch
            outs = outs[:self.n_outputs]
        return torch.from_numpy(outs[0]) if self.single_output else tuple(map(torch.from_numpy, outs))

    def _nonfinite_call(self, args, bad: list[int]):
        """NaN/inf in an input: the NaN policy hears of the graph inputs among them (a quantized
        model warns or raises), and this call's result is PyTorch's (eager's IEEE semantics)."""
        tell_policy(self.on_nonfinite, self.finite_checks, args, bad)
        self.info.nonfinite_calls = (self.info.nonfinite_calls or 0) + 1
        return self._pytorch(args)

    def _check_finite_in_pytorch(self, args) -> None:
        """The session is gone (fallback): the policy's sums are computed here instead."""
        if self.on_nonfinite is None:
            return
        tell_policy(self.on_nonfinite, self.finite_checks, args, [pos for pos, name in self.finite_checks.items()
                                 if name is not None and not math.isfinite(args[pos].sum().item())])

    def _compare(self, got, want) -> None:
        self.info.max_abs_diff = max(self.info.max_abs_diff or 0.0, worst_abs_diff(got, want))


def _direct_runner(fused: GraphModule):
    """When one cluster takes the graph inputs in order and produces every output (directly or
    through getitems), skip the FX interpreter: flatten inputs, call the cluster, pick and
    unflatten outputs (saves ~0.1 ms per call). Input checking stays in CompiledModule.
    Returns (run, None or, for a model taking and returning plain tensors, (the cluster, the
    model's order of its outputs) for `Executable.validating_run`)."""
    in_spec, out_spec = getattr(fused, "_in_spec", None), getattr(fused, "_out_spec", None)
    nodes = [n for n in fused.graph.nodes if n.op != "get_attr"]
    placeholders = [n for n in nodes if n.op == "placeholder"]
    calls = [n for n in nodes if n.op == "call_module" and str(n.target).startswith("cluster_")]
    output = next(n for n in nodes if n.op == "output")
    if in_spec is None or out_spec is None or len(calls) != 1:
        return None
    call = calls[0]
    results = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    if not all(isinstance(r, Node) for r in results):   # a constant output (`return y, 3`): the interpreter
        return None
    picked = {r for r in results if r.op == "call_function" and r.target is operator.getitem and r.args[0] is call}
    others = [n for n in nodes if n.op not in ("placeholder", "output") and n is not call and n not in picked
              and not (n.op == "call_module" and not n.users)]  # export's input guards
    if others or list(call.args) != placeholders or call.kwargs:
        return None
    cluster = getattr(fused, call.target)
    if not isinstance(cluster, OrtCluster):
        return None
    if cluster.single_output and list(results) == [call]:
        picks = None
    elif not cluster.single_output and all(r in picked for r in results):
        picks = [r.args[1] for r in results]
    else:
        return None
    positional = in_spec.child(0) if in_spec.num_children else None
    flat_in = positional is not None and in_spec.num_leaves == positional.num_leaves == len(placeholders) \
        and all(c.is_leaf() for c in positional.children())  # plain tensors, no kwargs: no pytree work
    leaves, unflatten = torch.utils._pytree.tree_leaves, torch.utils._pytree.tree_unflatten
    # A plain tuple of tensors out (the usual multi-output model): no pytree work per call.
    flat_out = out_spec.type is tuple and all(c.is_leaf() for c in out_spec.children())
    in_order = picks is not None and picks == list(range(len(picks)))

    def pick(out):   # the cluster's outputs -> the model's
        if picks is None:
            return out if out_spec.is_leaf() else unflatten((out,), out_spec)
        if flat_out:
            return out if in_order and len(out) == len(picks) else tuple(out[i] for i in picks)
        return unflatten([out[i] for i in picks], out_spec)

    def run(*args):
        return pick(cluster.forward(*(args if flat_in and len(args) == len(placeholders) else leaves(args))))
    # a whole call (validating_run) returns the session's outputs as they come, in the order
    # asked: the model's own order of the cluster's outputs, each once
    order = ([0] if out_spec.is_leaf() else None) if picks is None else \
        picks if flat_out and sorted(picks) == list(range(cluster.n_outputs)) else None
    return run, (cluster, order) if flat_in and order is not None else None



def _session_key(key: str, checks: dict[int, str]) -> str:
    return f"{key}|sums{sorted(checks)}" if checks else key


def _session_with_sums(model_bytes: bytes, opts: OrtOptions, key: str, checks: dict[int, str]):
    """The cluster's session, returning the listed inputs' sums too; if ONNX Runtime refuses
    that model, the plain session (`checks` emptied: the CompiledModule then checks those
    inputs itself)."""
    if checks:
        try:
            return _session(with_input_sums(model_bytes, list(checks)), opts, _session_key(key, checks))
        except Exception as exc:  # noqa: BLE001  (never lose the cluster to its NaN check)
            log.info("input sums not added to the session: %s", str(exc).splitlines()[0][:200])
            checks.clear()
    return _session(model_bytes, opts, key)


class OnnxRuntimeBackend:
    name = "onnxruntime"
    onnx_ops = "onnxruntime"   # the operator set clusters are translated into (export.StandardOnnxBackend: "standard")

    def __init__(self, options: OrtOptions | None = None):
        self.options = options or OrtOptions()
        if self.options.weight_only_compute not in COMPUTE_LEVELS:
            raise BackendError(f"unknown OrtOptions.weight_only_compute {self.options.weight_only_compute!r}",
                               hint=f"use one of {sorted(COMPUTE_LEVELS)}")
        self.capability = onnxruntime_capability()

    @staticmethod
    def quant_config(config, preset: bool):
        """A named preset on a CPU without VNNI gets 7-bit weights in its static ops: ORT's
        fused u8 x s8 kernels are exact only then; measured cost 0-2.8 dB SQNR on the zoo
        (docs/performance.md, AVX2 section). Its per-token linears keep 8-bit weights: their
        kernel (MatMulIntegerToFloat) runs them exactly as u8 x u8, as fast as 7-bit u8 x s8
        from 32 rows up on an AVX2 AMD EPYC (1.33x slower for one row: SmolLM2's decode step
        1.12x), and 7 bits cost SmolLM2-135M 6.6 dB of logits SQNR (22.2 -> 15.5 dB, top-1
        89.8% -> 86.3%; docs/accuracy.md). The dynamic preset (`transformer-dynamic`, the speed
        preset in ORT's own scheme) takes 7 bits in its linears too, as ORT advises for
        `quantize_dynamic` without VNNI (`reduce_range`): DynamicQuantizeMatMul's u8 x u8 path
        is 1.08-1.16x slower than its u8 x s8 one at the zoo's 32-row shapes (Zen 3, one
        thread), the zoo transformers 0.98-1.14x; 7 bits cost them 0.6-3.7 dB of SQNR
        (docs/performance.md). An explicit QuantConfig is respected; 8-bit weights
        in static ops then run on the exact u8 x u8 path (convs and requantized linears lose
        their fused kernel)."""
        if preset and not cpu.has_vnni() and config.weight_bits == 8:
            per_token = config.activations == "per-token"
            adjusted = dataclasses.replace(config, weight_bits=7,
                                           per_token_weight_bits=config.linear_weight_bits if per_token else None)
            return adjusted, ("7-bit weights" + (" outside per-token linears" if per_token else "")
                              + ": this CPU lacks VNNI, so ONNX Runtime's fused int8 kernels are exact only with "
                              "7-bit weights")
        return config, None

    @staticmethod
    def adjust_observers(observed) -> None:
        """Quantizing for this backend: add output scales snapped to proven-exact QLinearAdd."""
        snap_add_scales(observed)

    @staticmethod
    def export(cm, path, format: str, onnx_ops: str = "standard"):
        """The whole model as one ONNX file (export.py), lowered from cm's program when it was
        not compiled for this backend."""
        return export_onnx(cm, path, onnx_ops, {"standard": StandardOnnxBackend, "onnxruntime": OnnxRuntimeBackend,
                                                "qdq": QdqOnnxBackend})

    def legalize_passes(self) -> list:
        """Block ops ONNX Runtime lacks decomposed, ATen's alias ops renamed, torchlib's reduction
        and attention-rank gaps spelled out (and its scatter "mean", which was wrong, as sums into
        zeros), batch norm that
        updates its caller's running statistics and embedding's max_norm renormalization spelled
        out, and fused kernels where they are
        proven exact."""
        return [decompose_unsupported_block_ops(self.capability), ReplaceAliasOps(), WriteOutReductionDims(),
                WriteOutTrainingBatchNorm(), WriteOutEmbeddingRenorm(),
                ScatterIntoNeutral(frozenset({"mean"})),
                UnsqueezeAttentionTo4d(), FuseRequantize(), FuseDequantize(), FusePerTokenLinear()]

    def available(self) -> bool:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            return False
        return True

    def compile(self, gm: GraphModule) -> Executable:
        """Cluster, translate, create a session per cluster. A session ONNX Runtime refuses for
        want of a CPU kernel for one node at its types (float64 Conv or Erf, RandomNormalLike)
        names that node: it is refused and the graph clustered again, so it alone runs in
        PyTorch rather than its whole cluster."""
        check_finite = maps_float_to_integers(gm)   # before clustering moves the nodes into submodules
        gm.graph.eliminate_dead_code()   # an unused node must not become an output-less cluster
        compile_one = functools.partial(self._compile_cluster, check_finite=check_finite)
        fused, clustering, infos = compile_isolating_rejected(gm, self.capability, self.options.min_cluster_size,
                                                              compile_one, log, _MAX_KERNEL_REFUSALS)
        infos += pytorch_infos(clustering.unsupported, fused, len(infos))
        for name in bind_state(fused, OrtCluster):   # the session writes these buffers itself
            for info in infos:
                if info.ops == {name: 1} and info.backend == "pytorch":
                    info.backend, info.status = self.name, "state"
                    info.reason = "module state written by the session (I/O binding)"
        fused.graph.eliminate_dead_code()  # constants now live inside the clusters
        fused.recompile()
        direct, whole = _direct_runner(fused) or (None, None)
        cluster, order = whole or (None, None)
        # a quantized model's NaN policy: the sums of its graph inputs come from the sessions
        clusters = [m for m in fused.children() if isinstance(m, OrtCluster) and policy_inputs(m.finite_checks)] \
            if check_finite else []

        def on_nonfinite(handler) -> None:
            for cluster in clusters:
                cluster.on_nonfinite = handler
        return Executable(run=direct or fused, clusters=infos, module=fused,
                          needs_no_grad=direct is None,
                          engine_checked_inputs=frozenset().union(*(policy_inputs(c.finite_checks) for c in clusters)),
                          on_nonfinite=on_nonfinite,
                          validating_run=cluster.validating_run(gm, order) if cluster is not None else None)

    def _translate(self, sub: GraphModule, constants) -> bytes:
        """The cluster's ONNX model (with ONNX Runtime's contrib kernels where proven exact)."""
        return translate_cluster(sub, constants).SerializeToString()

    def _model_for(self, key: str, sub: GraphModule, constants, session_key: str) -> tuple[bytes, list[str], str]:
        """(ONNX bytes, runtime input names, 'memory' | 'disk' | 'miss')."""
        runtime_inputs = [n.name for n in sub.graph.nodes if n.op == "placeholder" and n.name not in constants]
        model = _MODELS.get(key)
        if model is not None and session_key in _SESSIONS:
            return model, runtime_inputs, "memory"
        cached, status = cache.load_entry(key)
        if cached is not None:
            _MODELS[key] = cached
            return cached, runtime_inputs, "disk"
        model_bytes = self._translate(sub, constants)
        _MODELS[key] = model_bytes
        cache.store_entry(key, model_bytes)
        return model_bytes, runtime_inputs, "rebuilt" if status == "corrupt" else "miss"

    def _compile_cluster(self, fused: GraphModule, call, index: int, mutated: set[str], *,
                         check_finite: bool = False, rejected: dict | None = None) -> ClusterInfo:
        """One cluster's session (or its fallback); a session refused for want of a kernel adds
        the FX nodes behind that ONNX node to `rejected` (name -> reason)."""
        sub: GraphModule = getattr(fused, call.target)
        inputs = split_inputs(fused, call, mutated)
        constants = inputs.constants
        info = ClusterInfo(index, self.name, sum(1 for n in sub.graph.nodes if n.op == "call_function"),
                           op_counts(sub))
        single = not isinstance(next(n for n in sub.graph.nodes if n.op == "output").args[0], (tuple, list))
        if not inputs.runtime_args:  # constants only (e.g. arange -> unsqueeze): no session
            install_constant(fused, call, inputs, info)
            return info
        checks = float_inputs(fused, inputs.runtime_args)
        model_bytes = None
        try:
            key = cache.cluster_key(sub, constants, (self.options, self.onnx_ops))
            with weight_only_compute(self.options.weight_only_compute):
                model_bytes, input_names, info.cache = self._model_for(key, sub, constants, _session_key(key, checks))
            session = _session_with_sums(model_bytes, self.options, key, checks)
            # Structurally identical clusters share a session: feed by the session's own input
            # names, whose order is the clusters' (positional) placeholder order.
            input_names = [i.name for i in session.get_inputs()]
            info.onnx = model_bytes
        except Exception as exc:  # emit or session creation failed: this cluster runs in PyTorch
            info.status, info.reason = "fallback", f"compile failed: {str(exc).splitlines()[0][:200]}"
            session, input_names = None, []   # (the warning: compile(), once the clusters are final)
            if rejected is not None:
                rejected.update(_rejected_nodes(exc, model_bytes, sub))
        setattr(fused, call.target, OrtCluster(sub, session, input_names, inputs.by_position, inputs.arity,
                                               single, info, checks))
        call.args = tuple(inputs.runtime_args)
        return info


class StandardOnnxBackend(OnnxRuntimeBackend):
    """ONNX Runtime running clusters in standard ONNX operators only: the form `qlower.export`
    writes by default (onnx/standard.py). No contrib-kernel fusions (FuseRequantize,
    FuseDequantize, FusePerTokenLinear), block-op functions inlined, and the integer rewrites of
    `onnx/exact_forms.py`'s `legalize` (dequantize as Cast/Sub/Cast/Mul, power-of-two quantize
    as Mul/Round/Add/Clip/Cast, quantized add/mul as 256x256 tables): IEEE-exact formulations,
    so ONNX Runtime stays bit-exact while OpenVINO, which folds DequantizeLinear into q*s - zp*s
    and adds the zero point before rounding, comes closer to the canonical numerics (measured on
    the zoo int8 vit: 44 of 60 outputs off by up to one quantum without them, 0 with them)."""
    onnx_ops = "standard"

    def legalize_passes(self) -> list:
        fusions = (FuseRequantize, FuseDequantize, FusePerTokenLinear)
        return [p for p in super().legalize_passes() if not isinstance(p, fusions)]

    def _translate(self, sub: GraphModule, constants) -> bytes:
        model = translate_standard(sub, constants)
        legalize(model)
        return model.SerializeToString()


class QdqOnnxBackend(StandardOnnxBackend):
    """Standard ONNX operators for a program in Q/DQ form (`qlower.export(onnx_ops="qdq")`):
    QuantizeLinear / DequantizeLinear stay as they are, the pattern every int8 ONNX consumer
    fuses into its own kernels (no IEEE-exact rewrite hiding it)."""
    onnx_ops = "qdq"

    def _translate(self, sub: GraphModule, constants) -> bytes:
        return translate_standard(sub, constants).SerializeToString()
