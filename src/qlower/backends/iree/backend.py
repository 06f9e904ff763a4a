"""The IREE backend: clusters of the graph become MLIR modules compiled by iree-compile for
llvm-cpu and run by iree.runtime; the rest runs in PyTorch.

Clusters come from `partition.cluster_graph` with the capability derived from the lowering
registry (lowerings.py). A cluster holding any integer op becomes one TOSA module emitted by
qlower (tosa_ops.py), its float ops imported one by one by torch's FX importer, lowered to
linalg and called as private functions; an all-float cluster goes through IREE's own torch
input pipeline whole (docs/iree.md says why). A cluster that fails to emit, compile or run falls
back to PyTorch (reason in the report, logged once on `qlower.iree`) and stays there.
"""
from __future__ import annotations

import dataclasses
import logging
import operator
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from ...fx import constant_value, copy_graph_module, mutated_attributes, full_args
from ...partition import Capability, cluster_graph
from ...passes.functionalize_state import WRITE_BACK
from ...core.types import ClusterInfo
from ...passes.scatter_into_neutral import ScatterIntoNeutral
from ..argument_checks import CHECKED_OPS, ArgumentCheck, checkable
from ..base import Compiling, Executable, decompose_unsupported_block_ops, op_counts
from ..cluster_sizes import SIZE_OPS, derive_sizes, one_user_per_size, sizes_with_their_users
from ..clusters import ConstantCluster, picks_with_their_producer, float_inputs, maps_float_to_integers, policy_inputs
from ...passes.iree.drop_noop_ceil_mode import DropNoopCeilMode
from ...passes.iree.matmul_to_bmm import MatmulToBmm
from ...passes.iree.name_bitwise_operators import NameBitwiseOperators
from ...passes.iree.bool_constants_as_int_compare import BoolConstantsAsIntCompare
from ...passes.iree.merge_reduction_dims import MergeReductionDims
from ...passes.iree.pad_single_window_convs import PadSingleWindowConvs
from ...passes.iree.unit_step_single_element_slices import UnitStepSingleElementSlices
from ...passes.iree.unsafe_index_as_index import UnsafeIndexAsIndex
from ...passes.iree.matrix_transpose_as_transpose import MatrixTransposeAsTranspose
from ...passes.iree.outer_products_as_mul import OuterProductsAsMul
from ...passes.iree.separate_float_products import SeparateFloatProducts
from . import tosa_ops  # noqa: F401  (registers the TOSA lowerings)
from .compiler import compile_mlir
from .data_tiling import DATA_TILING_FAILURES, PATH_NAMES, data_tiling_for, retry_path
from .lowerings import TOSA_LOWERINGS, float_check, kind_of, not_in_a_float_module, symbolic_size
from .options import IreeOptions
from .runner import IreeCluster, load_function, runtime_config
from .tosa_emit import CHECKED_ENTRY, EmittedModule, TosaEmitter
from .torch_import import import_float_cluster, input_symbols, not_importable_alone
from ...passes.decompose_block_ops import DecomposeBlockOps
from ...quantize.attention import SDPA, _sdpa_math
from .export import export_iree

log = logging.getLogger("qlower.iree")
_INPUT_TYPE = {"tosa": "tosa", "torch": "torch"}


def _either(tosa_check, name: str):
    """A shape op is lowerable on integers (TOSA) or on floats (importer)."""
    def check(node: Node) -> str | None:
        why = tosa_check(node)
        return None if why is None or float_check(node) is None else why
    check.__doc__ = "integer operand (TOSA) or float (torch importer)"
    return check


def torch_capability() -> Capability:
    cap = Capability("iree")
    cap.register("*", float_check)
    return cap


def iree_capability() -> Capability:
    """What the backend accepts, derived from the lowering registry: each TOSA lowering's check,
    float_check for every other ATen op."""
    cap = torch_capability()
    for name, lowering in TOSA_LOWERINGS.items():
        cap.register(name, lowering.check if name.startswith("qlower::") else _either(lowering.check, name))
    cap.register(SIZE_OPS, symbolic_size)
    # eager's IndexError / division by zero: checked on the host (IreeCluster), or the op stays in PyTorch
    for name in CHECKED_OPS:
        cap.register(name, _also(cap.ops.get(name, cap.ops["*"]), checkable))
    return cap


def _also(predicate, check):
    """`predicate`, then `check`; `qlower ops` shows both conditions."""
    def both(node: Node) -> str | None:
        return predicate(node) or check(node)
    both.__doc__ = f"{(predicate.__doc__ or 'always').strip().splitlines()[0]}; {check.__doc__.strip().splitlines()[0]}"
    return both


# A float batch matmul whose batch, M and K are all dynamic (attention's probs @ V inside an int8
# cluster with batch and sequence dynamic): iree-compile 3.13 fails with data tiling and without
# it ("'affine.delinearize_index' op no basis element may be statically non-positive"); without
# data tiling and with all micro-kernels it compiles (measured on the zoo transformer int8).
_UKERNEL_RETRY_FAILURES = ("no basis element may be statically non-positive",)


def _decompose_attention_among_integer_ops():
    """scaled_dot_product_attention in a quantized program becomes matmul / softmax / matmul.

    Inside a TOSA (integer) module the op is imported alone as `tm_tensor.attention`, which
    IREE 3.13 fails to legalize ("failed to legalize operation 'tm_tensor.attention' that was
    explicitly marked illegal"): every int8 cluster holding one would fall back whole (zoo hf-bert,
    hf-gpt2, hf-llama, SmolLM2). An all-float program keeps the op: IREE's torch input
    pipeline compiles it whole."""

    def keeps(node) -> bool:
        return not any(str(n.target).startswith("qlower.") for n in node.graph.nodes)
    return DecomposeBlockOps(keeps, why="iree compiles no tm_tensor.attention among integer ops",
                             table={SDPA: _sdpa_math})


def _decompose_ops_iree_lacks():
    """Ops IREE 3.13's torch pipeline does not lower, replaced by torch's own decompositions
    (`torch._decomp`), which it does — measured op by op:
    - `upsample_bilinear2d` (F.interpolate's bilinear mode; MobileViT resizes its feature maps
      with it): neither overload lowers ("failed to legalize operation 'torch.constant.int'":
      its size list is left unconsumed); the decomposition's gathers are `_unsafe_index`
      (UnsafeIndexAsIndex follows);
    - `index_copy` (a static KV cache's update, zoo hf-gpt2-kv / hf-llama-kv): left as a
      `torch.operator`; decomposed it is an `index_put`, which compiles and matches;
    - `diff` (transformers' packed-sequence check on position ids, SmolLM2): a `torch.operator`;
      it has no table entry, but it is CompositeImplicit: traced, the op itself becomes slices
      and a subtraction (and a `cat` of `prepend`).
    Undecomposed, every cluster holding one fails to compile and falls back whole unless
    refused (`lowerings._NOT_LEGALIZED`, which refuses what this leaves). Under symbolic
    shapes an op is decomposed where the decomposition reads no symbolic size (a dynamic
    batch: measured). Tried and not lowered either way (their decompositions reach prims that
    stay `torch.operator`): logsumexp, fmod, hypot, lgamma, i0, erfinv."""
    from torch._decomp import decomposition_table
    aten = torch.ops.aten
    ops = (aten.upsample_bilinear2d.vec, aten.upsample_bilinear2d.default, aten.index_copy.default)
    table = {op: decomposition_table[op] for op in ops} | {aten.diff.default: aten.diff.default}
    return DecomposeBlockOps(lambda node: False, why="iree 3.13 does not lower it", table=table)


def _reflection_pads_decomposed():
    """Reflection padding as torch's decomposition (index arithmetic and gathers): iree-compile
    3.13 rejects torch-mlir's lowering of it for some sizes, with data tiling or without
    ("'linalg.generic' op inferred input/output operand #0 has shape's dimension #1 to be greater
    than or equal to 32, but found 25": (1, 1, 400) padded by 32, (2, 3, 10) by (2, 1); (2, 1,
    40) by 3 compiled), which the capability accepts; decomposed,
    every one of those compiles and matches."""
    from torch._decomp import decomposition_table
    aten = torch.ops.aten
    by_rank = {n: decomposition_table[getattr(aten, f"reflection_pad{n}d").default] for n in (1, 2, 3)}

    def reflect(x, pad, mode="constant", value=None):
        return by_rank[len(pad) // 2](x, list(pad))

    def kept(node) -> bool:
        return node.target is aten.pad.default and full_args(node)[2] != "reflect"
    table = {aten.pad.default: reflect,
             **{getattr(aten, f"reflection_pad{n}d").default: by_rank[n] for n in (1, 2, 3)}}
    return DecomposeBlockOps(kept, why="iree-compile mis-sizes torch-mlir's reflection padding", table=table)


class IreeBackend:
    name = "iree"
    install_hint = "pip install 'qlower[iree]'  (or: pip install iree-base-compiler==3.13.0 iree-base-runtime==3.13.0)"

    def __init__(self, options: IreeOptions | None = None):
        self.options = options or IreeOptions()
        self.capability = iree_capability()

    @staticmethod
    def quant_config(config, preset: bool):
        """Named presets quantize linear inputs statically here: the run-time (per-token, dynamic)
        quantization ops have no IREE lowering and would leave every linear's input in PyTorch
        (measured: zoo transformer at batch 8, 7.9 ms fragmented). An explicit QuantConfig is
        respected."""
        if preset and config.run_time_activations:
            return dataclasses.replace(config, activations="static"), \
                f"static activations: the iree backend has no {config.activations} quantization lowering"
        return config, None

    def available(self) -> bool:
        try:
            import iree.compiler  # noqa: F401
            import iree.runtime  # noqa: F401
        except ImportError:
            return False
        return True

    export_targets = True   # export(..., target=) compiles the module for another device

    @staticmethod
    def export(cm, path, format: str, target: str | None = None):
        return export_iree(cm, path, format, target, IreeBackend)

    def legalize_passes(self) -> list:
        """Block ops IREE's capability lacks, decomposed; attention in a quantized program in
        its math form; pools whose ceil_mode changes nothing written without it (torch-mlir
        mis-sizes them); multi-dim float reductions over one merged dim (iree-compile fails);
        `&` / `^` as bitwise_and / bitwise_xor (torch-mlir lowers only those); boolean tensors
        created as int32 != 0 (torch-mlir fails on a boolean splat); rank-3 matmuls as bmm
        (torch-mlir cannot decompose them alone with a dynamic batch); bilinear upsampling,
        index_copy and diff as torch's decompositions (IREE lowers none), reflection padding as
        torch's (iree-compile mis-sizes torch-mlir's for some sizes), `_unsafe_index` as
        `index`, `mT` / `mH` / `adjoint` as `transpose`, float products with a reduction size of 1
        as broadcast multiplies (data tiling misread some), accumulating scatters (mean, and sums
        and products into their input) into a neutral tensor (IREE lost repeated indices), and
        float products read by a sum kept apart (IREE contracts them into FMAs)."""
        return [decompose_unsupported_block_ops(self.capability), _decompose_attention_among_integer_ops(),
                DropNoopCeilMode(), PadSingleWindowConvs(), UnitStepSingleElementSlices(), MergeReductionDims(),
                NameBitwiseOperators(), BoolConstantsAsIntCompare(),
                MatmulToBmm(), _decompose_ops_iree_lacks(), _reflection_pads_decomposed(), UnsafeIndexAsIndex(),
                MatrixTransposeAsTranspose(), OuterProductsAsMul(),
                ScatterIntoNeutral(), SeparateFloatProducts()]

    def compile(self, gm: GraphModule) -> Executable:
        """Cluster, emit and compile; a cluster iree-compile fails on, where the error names the
        ATen op it could not legalize, is compiled again without that op's nodes (they run in
        PyTorch; the rest of the cluster stays on IREE), at most `_ISOLATION_ROUNDS` times.
        Each round starts from a copy of the legalized graph (clustering rewrites it)."""
        return self.start(gm).finish()

    def start(self, gm: GraphModule) -> Compiling:
        """`compile` begun: the first round's clustering and emission now, in this thread (the
        MLIR bindings' context is per thread, and emission traces the float ops it imports); its
        native half is iree-compile, a subprocess per cluster, and the loading of its modules.
        `finish()` installs the clusters and compiles any further round itself."""
        first = self._emit_round(copy_graph_module(gm), {})
        return Compiling(lambda: self._compile_round(first), lambda: self._finish(gm, first))

    def _finish(self, gm: GraphModule, first: "_Round") -> Executable:
        """The executable from the compiled first round, after the further rounds its failures ask for."""
        refused: dict[str, str] = {}
        executable, rejected = self._install_round(first)
        for _ in range(_ISOLATION_ROUNDS - 1):
            if not rejected or rejected.keys() <= refused.keys():
                break
            refused.update(rejected)
            again = self._emit_round(copy_graph_module(gm), refused)
            self._compile_round(again)
            executable, rejected = self._install_round(again)
        for info in executable.clusters:   # the final round's (an earlier round's failure was retried)
            if info.backend == self.name and info.status == "fallback":
                log.warning("cluster #%d fell back to PyTorch: %s", info.id, info.reason)
        return executable

    def _emit_round(self, gm: GraphModule, refused: dict[str, str]) -> "_Round":
        """One round's clustering and emission, refusing `refused` (node name -> reason)."""
        check_finite = maps_float_to_integers(gm)   # before clustering moves the nodes into submodules
        fused, kinds, capability = self._fuse(gm, refused)
        mutated = mutated_attributes(fused)
        calls = [n for n in fused.graph.nodes if n.op == "call_module" and str(n.target).startswith("cluster_")]
        pending = [self._emit_cluster(fused, call, i, kinds[str(call.target)], mutated) for i, call in enumerate(calls)]
        if any(p.emitted is not None for p in pending):
            runtime_config(self.options.runtime_driver())   # created once, here, before compile threads share it
        return _Round(fused, kinds, capability, pending, check_finite)

    def _compile_round(self, r: "_Round") -> None:
        start = time.perf_counter()
        self._compile_all([p for p in r.pending if p.emitted is not None])
        r.seconds = time.perf_counter() - start

    def _install_round(self, r: "_Round") -> tuple[Executable, dict[str, str]]:
        """The compiled round installed: (the executable, nodes a failed cluster's error names)."""
        fused, pending = r.fused, r.pending
        for p in pending:
            self._install(fused, p)
        fused.graph.eliminate_dead_code()
        fused.recompile()
        infos = [p.info for p in pending]
        infos += self._pytorch_infos(fused, len(infos), r.capability)
        counts = {k: sum(1 for v in r.kinds.values() if v == k) for k in ("tosa", "torch")}
        notes = [p.retry_note for p in pending if p.retry_note]
        notes.append(f"iree: {counts['tosa']} TOSA + {counts['torch']} torch-dialect clusters, "
                     f"iree-compile {r.seconds:.2f} s")
        direct = _whole_model_runner(fused)
        # a quantized model's NaN policy: the sums of its graph inputs come from the runners
        checked = [m for m in fused.children() if isinstance(m, IreeCluster) and policy_inputs(m.finite_checks)] \
            if r.check_finite else []

        def on_nonfinite(handler) -> None:
            for cluster in checked:
                cluster.on_nonfinite = handler
        executable = Executable(run=direct or fused, clusters=infos, module=fused, notes=notes,
                                needs_no_grad=direct is None,
                                engine_checked_inputs=frozenset().union(*(policy_inputs(c.finite_checks)
                                                                          for c in checked)),
                                on_nonfinite=on_nonfinite)
        return executable, {name: why for p in pending for name, why in _named_by_failure(p).items()}

    # ------------------------------------------------------------------ clustering
    def _fuse(self, gm: GraphModule, refused: dict[str, str]) -> tuple[GraphModule, dict[str, str], Capability]:
        """Clusters of supported nodes, fused into call_module nodes. A cluster with any integer
        op is a "tosa" module (its float ops become private functions in it); an all-float
        cluster is a "torch" module for IREE's own torch input pipeline; a float op a TOSA module
        cannot import (`not_importable_alone`), or an all-float module cannot hold
        (`not_in_a_float_module`), is refused and the graph clustered again.
        Returns (graph, submodule name -> kind, the capability with those refusals)."""
        one_user_per_size(gm)
        refused = dict(refused)
        while True:   # a float op a TOSA module cannot import leaves it: cluster again without it
            clusters = sizes_with_their_users(picks_with_their_producer(
                cluster_graph(gm.graph, self.capability.refusing(refused), self.options.min_cluster_size).clusters))
            tosa = [any(kind_of(n) == "tosa" for n in c) for c in clusters]
            more = {n.name: why for c, t in zip(clusters, tosa) for n in c if kind_of(n) == "torch" and
                    (why := not_importable_alone(n, input_symbols(c)) if t else not_in_a_float_module(n)) is not None}
            if not more:
                break
            refused.update(more)
        kinds = {f"cluster_{i}": ("tosa" if t else "torch") for i, t in enumerate(tosa)}
        fused = fuse_by_partitions(gm, [dict.fromkeys(c) for c in clusters], prefix="cluster_")
        return fused, kinds, self.capability.refusing(refused)

    @staticmethod
    def _pytorch_infos(fused: GraphModule, start: int, capability: Capability) -> list[ClusterInfo]:
        """One ClusterInfo per computing node left in PyTorch, with the capability's reason."""
        infos = []
        for node in fused.graph.nodes:
            if node.op != "call_function" or not _computes(node):
                continue
            reason = capability.why_not(node)
            if reason is None:
                continue   # supported, but a lone shape op between clusters: PyTorch by design
            status = "state" if node.meta.get(WRITE_BACK) else "fallback"
            infos.append(ClusterInfo(start + len(infos), "pytorch", 1, {node.name: 1}, status,
                                     "module state write-back" if status == "state" else reason))
        return infos

    # --------------------------------------------------------------- one cluster
    def _emit_cluster(self, fused: GraphModule, call: Node, index: int, kind: str, mutated: set[str]) -> "_Pending":
        """Bind the cluster's constants and emit its MLIR (serially: the bindings' context is
        per thread). A cluster without runtime inputs is evaluated now instead."""
        sub: GraphModule = getattr(fused, call.target)
        runtime_args = _bind_constants(fused, sub, call, mutated)
        info = ClusterInfo(index, self.name, sum(1 for n in sub.graph.nodes if n.op == "call_function"),
                           op_counts(sub))
        pending = _Pending(call, sub, info, kind, runtime_args)
        if not runtime_args:
            info.status, info.reason = "constant", "no runtime inputs: evaluated once at compile time"
            return pending
        try:
            pending.runtime_args = derive_sizes(sub, runtime_args)
            _check_tensor_outputs(sub)
            pending.emitted = TosaEmitter(sub, self.options).emit(tuple(float_inputs(fused, pending.runtime_args))) \
                if kind == "tosa" else import_float_cluster(sub)
        except Exception as exc:
            self._failed(pending, exc)
        return pending

    def _compile_all(self, pending: list["_Pending"]) -> None:
        """iree-compile runs as a subprocess, so clusters compile in parallel threads."""
        def one(p: _Pending) -> None:
            try:
                compiled = self._compile_with_retry(p)
                p.info.cache = compiled.cache
                if compiled.note:
                    log.info("cluster #%d: %s", p.info.id, compiled.note)
                entry = CHECKED_ENTRY if p.emitted.input_sums else "main"
                p.function = load_function(compiled.vmfb, self.options.runtime_driver(), entry)
                p.compiled = compiled
            except Exception as exc:   # compile/load failed: this cluster runs in PyTorch
                self._failed(p, exc)
        workers = max(1, min(len(pending), os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, pending))

    def _compile_with_retry(self, p: "_Pending"):
        """iree-compile with data tiling on the path that does not miscompile the cluster
        (data_tiling.py); where data tiling makes iree-compile fail (f32 batched matmuls among
        data-tiled int8 ones on the dispatch-creation path: "'iree_codegen.load_from_buffer' op
        buffer and tensor shapes must be compatible", the zoo hf-bert's attention; a masked mean
        pooling over a dynamic sequence: "'affine.delinearize_index' op no basis element may be
        statically non-positive") again on the other path, then without data tiling; then, for a
        failure only the micro-kernels avoid (`_UKERNEL_RETRY_FAILURES`), with all of them.
        Without data tiling a cluster's int8 matmuls are ~3x slower, still far faster than
        PyTorch; the report says what was done."""
        options, note = data_tiling_for(self.options.resolved_for(p.info.ops), p.sub)
        notes = [note] if note else []
        tried = set()
        while True:
            try:
                compiled = compile_mlir(p.emitted.asm, _INPUT_TYPE[p.kind], options)
                break
            except Exception as exc:  # noqa: BLE001  (known IREE failures retried, others re-raised)
                message = str(exc)
                if options.data_tiling and any(m in message for m in DATA_TILING_FAILURES):
                    tried.add(options.data_tiling_path)
                    other = retry_path(options, p.sub, tried)
                    if other is not None:
                        notes.append(f"with {PATH_NAMES[other]} data tiling ({PATH_NAMES[options.data_tiling_path]}'s "
                                     f"failed: {_first_line(exc)[:120]})")
                        options = dataclasses.replace(options, data_tiling_path=other)
                        continue
                    notes.append(f"without data tiling (with it: {_first_line(exc)[:160]})")
                    options = dataclasses.replace(options, data_tiling=False)
                elif (options.ukernels != "all" and not options.is_gpu
                      and any(m in message for m in _UKERNEL_RETRY_FAILURES)):
                    notes.append("with all micro-kernels")
                    options = dataclasses.replace(options, ukernels="all")
                else:
                    raise
        if notes:
            p.retry_note = f"iree: cluster #{p.info.id} compiled " + " and ".join(notes)
        return compiled

    @staticmethod
    def _failed(p: "_Pending", exc: Exception) -> None:
        p.info.status, p.info.reason = "fallback", f"{p.kind} compile failed: {_first_line(exc)}"
        p.error = str(exc)

    def _install(self, fused: GraphModule, p: "_Pending") -> None:
        """Replace the fused submodule by its runner (or its constant value), which sums the
        cluster's float32 inputs on every call (clusters.float_inputs)."""
        if p.info.status == "constant":
            with torch.no_grad():
                setattr(fused, p.call.target, ConstantCluster(p.sub()))
            p.call.args = ()
            return
        out = next(n for n in p.sub.graph.nodes if n.op == "output").args[0]
        single = not isinstance(out, (tuple, list))
        # (a value that is no tensor — a chunk's list — only in a cluster that failed to emit)
        dtypes = [getattr(o.meta.get("val"), "dtype", None) for o in ([out] if single else out)]
        compiled = p.compiled
        setattr(fused, p.call.target, IreeCluster(p.sub, p.function, dtypes, single, p.info, p.kind,
                                                  p.emitted.asm if p.emitted is not None else None,
                                                  compiled.vmfb if compiled else None,
                                                  compiled.command if compiled else None,
                                                  float_inputs(fused, p.runtime_args),
                                                  self.options.runtime_driver(),
                                                  engine_sums=bool(p.emitted is not None and p.emitted.input_sums),
                                                  argument_check=ArgumentCheck(p.sub)))
        p.call.args = tuple(p.runtime_args)


@dataclass
class _Round:
    """One round of `compile`: the clustered graph and its clusters, from emission to installation."""
    fused: GraphModule
    kinds: dict[str, str]         # submodule name -> "tosa" | "torch"
    capability: Capability        # with the round's refusals
    pending: list["_Pending"]
    check_finite: bool            # a quantized model's NaN policy applies
    seconds: float = 0.0          # iree-compile's wall time


@dataclass
class _Pending:
    """A cluster between emission and installation."""
    call: Node
    sub: GraphModule
    info: ClusterInfo
    kind: str
    runtime_args: list
    emitted: EmittedModule | None = None
    function: object = None
    compiled: object = None   # compiler.CompiledVmfb
    retry_note: str | None = None   # compiled only on the retry without data tiling
    error: str | None = None        # why emission or iree-compile failed


# iree-compile names the op it cannot legalize: "failed to legalize operation 'torch.aten.erfc'"
# or, for a `torch.operator`, `<{name = "torch.aten.addmv"}>` (measured over the OpInfo sweep:
# most compile failures name one). A failure naming nothing (a 'torch.constant.int' it could not
# legalize) still takes its cluster to PyTorch.
_NAMED_OP = re.compile(r"torch\.aten\.(\w+)")
_ISOLATION_ROUNDS = 4


def _named_by_failure(p: "_Pending") -> dict[str, str]:
    """The cluster's nodes whose ATen op its iree-compile error names (node name -> reason)."""
    if p.error is None or p.info.status != "fallback":
        return {}
    named = {f"aten::{op}" for op in _NAMED_OP.findall(p.error)}
    reason = f"iree-compile fails on it: {_first_line(Exception(p.error))[:200]}"
    return {n.name: reason for n in p.sub.graph.nodes
            if n.op == "call_function" and getattr(n.target, "_schema", None) is not None
            and n.target._schema.name in named}


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if "error:" in ln] or text.splitlines() or [type(exc).__name__]
    return lines[0][:300]


def _computes(node: Node) -> bool:
    """Not an output pick of a fused cluster, not an assertion that returns nothing."""
    if node.target is operator.getitem and getattr(node.args[0], "op", None) == "call_module":
        return False
    schema = getattr(node.target, "_schema", None)
    return not (schema is not None and not node.users and len(schema.returns) == 0)


def _bind_constants(fused: GraphModule, sub: GraphModule, call: Node, mutated: set[str]) -> list[Node]:
    """Move the cluster's constant inputs into `sub` as buffers (get_attr nodes), so the call
    passes only runtime values and emitters see weights as constants. Returns the runtime args."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    runtime = []
    for i, (ph, outer) in enumerate(zip(placeholders, call.args)):
        is_state = getattr(outer, "op", None) == "get_attr" and outer.target in mutated
        value = None if is_state else constant_value(fused, outer)
        if value is None:
            runtime.append(outer)
            continue
        name = f"_const_{i}"
        sub.register_buffer(name, value)
        with sub.graph.inserting_before(ph):
            attr = sub.graph.get_attr(name)
        attr.meta = dict(ph.meta)
        ph.replace_all_uses_with(attr)
        sub.graph.erase_node(ph)
    sub.recompile()
    return runtime


def _check_tensor_outputs(sub: GraphModule) -> None:
    out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    for o in (out if isinstance(out, (tuple, list)) else [out]):
        if not isinstance(getattr(o, "meta", {}).get("val"), torch.Tensor):
            raise NotImplementedError(f"cluster output {o} is not a tensor")


def _whole_model_runner(fused: GraphModule):
    """When one single-output cluster is the whole model (plain tensor inputs passed in order,
    its result the output), call it directly: the FX GraphModule's pytree handling costs
    ~20 us per call, as much as the IREE call itself. Input checks stay in CompiledModule."""
    in_spec, out_spec = getattr(fused, "_in_spec", None), getattr(fused, "_out_spec", None)
    nodes = [n for n in fused.graph.nodes if n.op != "get_attr"]
    placeholders = [n for n in nodes if n.op == "placeholder"]
    calls = [n for n in nodes if n.op == "call_module" and str(n.target).startswith("cluster_")]
    output = next(n for n in nodes if n.op == "output")
    if in_spec is None or out_spec is None or len(calls) != 1 or not out_spec.is_leaf():
        return None
    call = calls[0]
    guards = [n for n in nodes if n.op == "call_module" and not n.users]   # export's input guards
    if len(nodes) != len(placeholders) + 2 + len(guards) or list(call.args) != placeholders \
            or call.kwargs or output.args[0] not in (call, (call,), [call]):
        return None
    cluster = getattr(fused, call.target)
    positional = in_spec.child(0) if in_spec.num_children else None
    if not isinstance(cluster, IreeCluster) or not cluster.single_output or positional is None \
            or positional.num_leaves != len(placeholders) or in_spec.num_leaves != len(placeholders) \
            or not all(c.is_leaf() for c in positional.children()):
        return None

    # No no_grad context: the IREE call records no autograd history, and the PyTorch fallback
    # (IreeCluster._pytorch) takes its own.
    return cluster.forward
