"""One cluster (an FX GraphModule of ATen ops and qlower ops) -> one ONNX model, through the
ecosystem's translator: the cluster is re-captured with torch.export (its constants bound as
buffers, its symbolic dims declared as `torch.export.Dim`s with their ranges) and handed to
`torch.onnx.export` with qlower's own ops in the custom translation table (lowering/). torchlib
translates every ATen op, including shape arithmetic on symbolic sizes; qlower translates only
its integer ops and block ops.

After translation: torchlib's own helper functions inlined (as torch.onnx.export does), then
onnxscript's optimizer (constant folding, dead code; qlower's functions are NOT inlined, so
block ops stay one node in exported files), then FlattenRows (keeps activations between QGemms
2-D).
"""
from __future__ import annotations

import contextlib
import functools
import math
import logging
import re

import numpy as np
import onnx
import torch
from torch.fx import GraphModule

from ..fx import torch_deprecation_silenced
from ..shapes import dynamic_spec, example_inputs
from .flatten_rows import flatten_rows
from .lowering import translation_table, functions
from .bfloat16_values import widen_bfloat16_boundary
from .lowering.onnx_ops import OPSET, bound_constants, QLOWER_DOMAIN
from .opset_changes import upgrade_opset_18_nodes
from .rewrite_rules import exact_rewrite_rules
from .direct_forms import rename_to_direct_forms
from .decompositions import DECOMPOSITIONS, applies_to, decomposes


class TranslateError(Exception):
    """The cluster could not be translated to ONNX (the cluster falls back to PyTorch)."""


class _Cluster(torch.nn.Module):
    """The cluster with its constant inputs bound as buffers: forward takes runtime inputs only."""

    def __init__(self, sub: GraphModule, constants: dict[str, torch.Tensor]):
        super().__init__()
        self.sub = sub
        self.slots: list[str | None] = []
        for node in sub.graph.nodes:
            if node.op != "placeholder":
                continue
            if node.name in constants:
                buffer = f"c{len(self.slots)}"
                self.register_buffer(buffer, constants[node.name])
                self.slots.append(buffer)
            else:
                self.slots.append(None)

    def forward(self, *runtime):
        it = iter(runtime)
        return self.sub(*[getattr(self, s) if s is not None else next(it) for s in self.slots])


@contextlib.contextmanager
def _quiet():
    """torch.onnx logs each capture step and torchlib's skipped registrations; qlower reports
    failures itself (as cluster fallbacks with their reason)."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export", "onnxscript", "onnx_ir")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _capture(sub: GraphModule, constants: dict[str, torch.Tensor]) -> torch.export.ExportedProgram:
    module = _Cluster(sub, constants)
    runtime = [n for n in sub.graph.nodes if n.op == "placeholder" and n.name not in constants]
    scalars = [n for n in runtime if not isinstance(n.meta.get("val"), torch.Tensor)]
    if scalars:   # cluster_sizes.derive_sizes computed every size it could from the tensor inputs
        what = "a tuple" if isinstance(scalars[0].meta.get("val"), (tuple, list)) else "a scalar"
        raise TranslateError(f"input {scalars[0].name} is {what}, not a tensor, and the cluster cannot compute it "
                             f"from its tensor inputs (an ONNX model takes tensors)")
    vals = [n.meta["val"] for n in runtime]
    last: Exception | None = None
    for named in (True, False):   # declared ranges first; AUTO where export refines a relation
        try:
            return torch.export.export(module, example_inputs(vals), dynamic_shapes=(dynamic_spec(vals, named),),
                                       strict=False)  # one spec per *runtime arg
        except Exception as exc:  # torch raises many types; each means "not capturable this way"
            last = exc
    raise TranslateError(f"re-capture failed: {str(last).splitlines()[0][:200]}") from last


# torchlib's opset-20 variants: the graph `torch.onnx.export` (torch 2.13) produces by default
# for the float ops, so qlower fp32 runs the model the torch.onnx + ONNX Runtime peer runs; the
# opset-18 variants decomposed gelu into Div/Erf/Add/Mul/Mul, which ONNX Runtime's GeluFusion did
# not match (measured: 5 nodes per layer instead of one BiasGelu on MiniLM). Opset-20 nodes keep
# their meaning under the model's opset-23 import (qlower's block ops need 23).
TORCHLIB_OPSET = 20


@functools.lru_cache(maxsize=1)
def _registry():
    """torchlib's registry plus qlower's translations, built once per process: building it is
    what `torch.onnx.export(custom_translation_table=...)` does on every call (measured 2-3 s,
    most of a zoo model's compile time), so qlower calls the exporter core with a cached one."""
    from torch.onnx._internal.exporter._registration import ONNXRegistry
    with _quiet():   # "torchvision is not installed. Skipping torchvision::nms" x4
        registry = ONNXRegistry.from_torchlib(opset_version=TORCHLIB_OPSET)
    for target, fn in translation_table().items():
        registry.register_op(target, fn)
    return registry


def translate_cluster(sub: GraphModule, constants: dict[str, torch.Tensor]) -> onnx.ModelProto:
    """The ONNX model of a cluster: graph inputs are its runtime placeholders in order, graph
    outputs its outputs in order; constants are initializers."""
    import onnx_ir as ir
    with _quiet(), torch.no_grad(), torch_deprecation_silenced():
        ep = _capture(sub, constants)

        def translated():
            try:
                with bound_constants(_constants_by_input(ep)):
                    model = _to_onnx(_prepared_for_onnx(ep))
            except Exception as exc:
                raise TranslateError(_first_cause(exc)) from exc
            _add_called_functions(model)
            _declare_opset(model)
            return model
        model = _optimized(translated)
    _register_folded_constants(model)
    _nonnegative_axes(model)
    _outputs_from_nodes(model)
    _outputs_in_declared_dtypes(model, sub)
    widen_bfloat16_boundary(model)
    proto = ir.serde.serialize_model(model)
    return _flatten_rows(proto)


# onnxscript's pattern rewriter matches every rule at every node (measured: 46 s of a 76 s
# compile on an unrolled 5x5 Jacobi eigensolver, ~10k nodes); ONNX Runtime's own graph
# optimizer fuses at session creation anyway, so graphs beyond this size skip the rewrite rules.
REWRITE_NODE_LIMIT = 3000


def _optimized(translated):
    """The translated model through onnxscript's optimizer (its rewrite rules only below
    REWRITE_NODE_LIMIT nodes)."""
    model = translated()
    if len(model.graph) > REWRITE_NODE_LIMIT:
        _optimize(model)
        return model
    try:
        _optimize(model, exact_rewrite_rules())
    except Exception:  # noqa: BLE001  (the optimizer is optional; its failure is not the cluster's)
        # onnxscript 0.7.2's Clip-Clip fusion reads the dtype of a value shape inference left
        # unknown (a Clip after a com.microsoft op: AttributeError, and the cluster would fall back;
        # found by the onnxruntime fuzz run). The failed pass may have left
        # the model half-rewritten: translate again and run the optimizer's passes but its
        # rewrite rules.
        model = translated()
        _optimize(model)
    return model


TORCHLIB_DOMAIN = "pkg.onnxscript.torch_lib"


def _optimize(model, rewrite_rules: tuple = ()) -> None:
    """torchlib's functions inlined, then onnxscript 0.7.2's `optimizer.optimize_ir(model,
    inline=False)` pass list — constant folding, pattern rewrites (`rewrite_rules`; none: the
    rewriter is skipped), dead code, constants lifted to initializers and deduplicated, common
    subexpressions, names fixed — with qlower's rules.

    Why inline torchlib's functions: `aten_getitem` (a list element, e.g. of `split`) is one,
    and inside it the folder cannot see SequenceAt(SequenceConstruct(...)), so ONNX Runtime ran
    real sequence ops (HF GPT-2 fp32: 6 SequenceAt and 2 SequenceConstruct in the session
    graph, none in torch.onnx.export's, which inlines everything). qlower's own functions (block
    ops) stay functions."""
    import onnx_ir as ir
    from onnxscript import rewriter
    from onnxscript.optimizer import _constant_folding
    common = ir.passes.common
    fold = _constant_folding.FoldConstantsPass(
        shape_inference=True, input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
        output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT, should_fold=lambda node: None)
    rewrite = [rewriter.RewritePass(rewrite_rules)] if rewrite_rules else []
    ir.passes.Sequential(
        common.InlinePass(criteria=lambda function: function.domain.startswith(TORCHLIB_DOMAIN)),
        ir.passes.PassManager([fold, *rewrite, common.RemoveUnusedNodesPass(), common.RemoveUnusedFunctionsPass(),
                               common.RemoveUnusedOpsetsPass()], steps=2, early_stop=True),
        common.RemoveUnusedNodesPass(), common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.LiftSubgraphInitializersToMainGraphPass(), common.DeduplicateInitializersPass(),
        common.CommonSubexpressionEliminationPass(), common.OutputFixPass(), common.NameFixPass())(model)


@functools.lru_cache(maxsize=1)
def _translated_as_is() -> frozenset:
    """The ATen overloads torchlib (or qlower's table) translates directly, but those
    decompositions.py decomposes first (a torchlib translation measured wrong)."""
    from torch.onnx._internal.exporter import _decomp
    always = {target for target, fn in DECOMPOSITIONS.items() if applies_to(fn) is None}
    return frozenset(_decomp.get_onnx_implemented_overloads(_registry())) - frozenset(always)


@functools.lru_cache(maxsize=1)
def exporter_decompositions() -> dict:
    """The table torch.onnx decomposes with (every op neither torchlib nor qlower translates),
    with decompositions.py's entries for ops that table leaves untranslatable. Built once per
    process (~0.15 s; torch.onnx rebuilds it on every export)."""
    from torch.onnx._internal.exporter import _decomp
    table = _decomp.create_onnx_friendly_decomposition_table(set(_translated_as_is()))
    for target, ours in DECOMPOSITIONS.items():
        chained = getattr(ours, "otherwise_torch", False) and target in table
        table[target] = _falling_back(ours, table[target]) if chained else ours
    return table


def _falling_back(ours, theirs):
    """A conditional decomposition marked `otherwise_torch`: the calls it leaves (NotImplemented)
    take torch's decomposition, as they would without it."""
    def decomposition(*args, **kwargs):
        result = ours(*args, **kwargs)
        return theirs(*args, **kwargs) if result is NotImplemented else result
    decomposition.applies = ours.applies
    return decomposition


# What torch.onnx's `remove_assertion_nodes` drops after the decomposition step (torch 2.13's
# list): such a node needs no translation, nor a re-trace.
ASSERTIONS = frozenset({torch.ops.aten.sym_constrain_range_for_size.default, torch.ops.aten._assert_async.default,
                        torch.ops.aten._assert_async.msg, torch.ops.aten._assert_scalar.default,
                        torch.ops.aten._assert_tensor_metadata.default})


def _needs_decomposition(ep: torch.export.ExportedProgram) -> bool:
    """True unless every node is translated as it stands: a non-mutating overload torchlib or
    qlower implements, or Python's `operator` (getitem, SymInt arithmetic). Anything else
    (in-place ops, CompositeImplicitAutograd ops such as aten.to.dtype or batch_norm that
    decompose on re-trace, higher-order ops) takes torch.onnx's full decomposition."""
    direct = _translated_as_is()
    for node in ep.graph.nodes:
        if node.op != "call_function" or node.target in ASSERTIONS:
            continue
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            if target not in direct or target._schema.is_mutable or decomposes(node):
                return True
        elif getattr(target, "__module__", None) != "_operator":
            return True
    return False


def has_complex_translation(target) -> bool:
    """torchlib registers complex tensors' translations apart (a complex64 value is a float32
    pair there); the exporter dispatches a call with a complex input to those only (measured:
    exp, where, _to_copy, cumsum of a complex tensor have none)."""
    return any(d.is_complex for d in _registry().get_decomps(target))


def _prepared_for_onnx(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """What `torch.onnx.export` does to an ExportedProgram before translating it (decompose with
    its table, explicit type promotion, no assertion nodes), except that the decomposition, a
    full re-trace with fake tensors, runs only when some node needs it: a cluster of ops torchlib
    translates as they are comes out unchanged. Measured (40 fuzz examples, 63 clusters, one
    thread): the re-trace and the table were 0.51 of the 0.86 s each cluster took to translate."""
    from torch.onnx._internal.exporter import _fx_passes
    with torch.fx.experimental._config.patch(backed_size_oblivious=True):   # as torch.onnx: 0/1 dims stay symbolic
        rename_to_direct_forms(ep.graph_module)
        if _needs_decomposition(ep):
            ep = ep.run_decompositions(exporter_decompositions())
        graph_module = ep.graph_module
        _fx_passes.insert_type_promotion_nodes(graph_module)
        _float64_scalars_as_exact_parts(graph_module)
        ep._graph_module = _fx_passes.remove_assertion_nodes(graph_module)
    return ep


def _float64_scalars_as_exact_parts(graph_module: torch.fx.GraphModule) -> None:
    """A float64 scalar_tensor whose value float32 cannot hold becomes the sum of float32 parts
    that add up to it exactly in float64: torchlib writes scalar_tensor's value as a float32
    attribute before casting it, and the type promotion pass turns every Python float on a
    float64 tensor (x * 0.1) into one, so such models were 1.5e-8 relative off on ONNX Runtime
    (measured). Two parts (~48 bits) left x * 0.1 up to 6 ulps off (0.1 became
    0.10000000000000009) and 1e300 inf; three parts, times powers of two beyond float32's
    range, give every finite float64 exactly (`_float32_terms`).
    BEFORE: scalar_tensor(0.1, dtype=float64)
    AFTER:  add(add(scalar_tensor(p0), scalar_tensor(p1)), scalar_tensor(p2))   (all float64;
            then mul(·, scalar_tensor(2^k)) steps for a value beyond float32's range)"""
    graph = graph_module.graph
    for node in list(graph.nodes):
        if node.target is not torch.ops.aten.scalar_tensor.default or node.kwargs.get("dtype") is not torch.float64:
            continue
        value = node.args[0]
        if not isinstance(value, float) or not math.isfinite(value):
            continue
        parts, factors = _float32_terms(value)
        if (parts, factors) == ((value,), ()):   # float32 holds it: torchlib's constant is exact
            continue
        with graph.inserting_before(node):   # (each insertion goes before `node`: in order)
            constant = lambda c: graph.call_function(node.target, (c,), dict(node.kwargs))
            new_nodes = [constant(part) for part in parts]
            total = new_nodes[0]
            for part in new_nodes[1:]:
                total = graph.call_function(torch.ops.aten.add.Tensor, (total, part))
                new_nodes.append(total)
            for factor in factors:
                new_nodes.append(constant(factor))
                total = graph.call_function(torch.ops.aten.mul.Tensor, (total, new_nodes[-1]))
                new_nodes.append(total)
        for new in new_nodes:
            new.meta = dict(node.meta)
        node.replace_all_uses_with(total)
        graph.erase_node(node)
    graph_module.recompile()


_FLOAT32_MAX = float(np.finfo(np.float32).max)
_STEP = 120   # 2^±120: a power of two float32 holds


def _exact_float32_parts(value: float) -> tuple[float, ...] | None:
    """Up to three float32 values whose float64 sum, left to right, is `value` exactly (each the
    float32 nearest to what is left; zero parts dropped), or None where float32's range cannot
    hold them."""
    parts, rest = [], value
    for _ in range(3):
        if abs(rest) > _FLOAT32_MAX:
            return None
        part = float(np.float32(rest))
        parts.append(part)
        rest -= part
    total = parts[0]
    for part in parts[1:]:
        total += part
    return (parts[0], *(p for p in parts[1:] if p != 0)) if total == value else None


def _float32_terms(value: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Float32 parts and power-of-two factors with (p0 + p1 + p2) * f0 * f1 ... == value exactly in
    float64: the parts of value itself where float32's range allows, else of its frexp mantissa,
    the exponent in steps float32 holds (1e300, 1e-300: two halves had made them inf and 0)."""
    parts = _exact_float32_parts(value)
    if parts is not None:
        return parts, ()
    mantissa, exponent = math.frexp(value)
    factors = []
    while exponent:
        step = max(-_STEP, min(_STEP, exponent))
        factors.append(2.0 ** step)
        exponent -= step
    return _exact_float32_parts(mantissa), tuple(factors)


def _to_onnx(ep: torch.export.ExportedProgram):
    """torch.onnx's translation step (torchlib + qlower's table) on a prepared program: an onnx_ir model."""
    from torch.onnx._internal.exporter import _core, _flags

    @_flags.set_onnx_exporting_flag   # torch.onnx.is_in_onnx_export() is True while translating, as in export
    def translate():
        return _core._exported_program_to_onnx_program(ep, registry=_registry()).model
    return translate()


def _add_called_functions(model) -> None:
    """Functions that qlower's functions call (group_norm_silu calls group_norm): the exporter
    adds the function a translation calls, not the ones that calls in turn."""
    import onnx_ir as ir
    import onnxscript
    bodies = {obj.name: obj for obj in vars(functions).values() if isinstance(obj, onnxscript.OnnxFunction)}
    pending = list(model.functions.values())
    while pending:
        for node in pending.pop():
            key = (node.domain, node.op_type, node.overload)
            if node.domain == QLOWER_DOMAIN and key not in model.functions and node.op_type in bodies:
                function = ir.serde.deserialize_function(bodies[node.op_type].to_function_proto())
                model.functions[key] = function
                model.opset_imports.setdefault(QLOWER_DOMAIN, 1)
                pending.append(function)


def _declare_opset(model) -> None:
    """Import the standard domain at OPSET. torchlib emits opset-18 ops, whose semantics are
    unchanged up to 23 (later opsets only add types and attributes) except DFT's and GridSample's
    (`opset_changes`); qlower's block ops need 23.
    torch.onnx's own version conversion is not used: it inlines every function first, and block
    ops must stay one node."""
    model.opset_imports[""] = OPSET
    for function in model.functions.values():
        function.opset_imports[""] = OPSET
    upgrade_opset_18_nodes(model)   # the two ops whose opset-18 form is invalid at 20+


def _register_folded_constants(model) -> None:
    """Constants the optimizer folded and gave colliding names (two `flatten`s of one input:
    `runtime_0/shape` and `runtime_0/shape_1`) keep only one initializer entry, so the model read
    an undefined value and ONNX Runtime rejected the cluster (found by fuzzing): every constant a
    node reads is registered under its own, unique name."""
    graph = model.graph
    names = {v.name for v in graph.inputs}
    for node in graph:
        for value in node.inputs:
            if value is None or value.producer() is not None or value.const_value is None:
                continue
            if graph.initializers.get(value.name) is value:
                continue
            base, k = value.name or "folded", 0
            while value.name in names or (value.name in graph.initializers
                                          and graph.initializers[value.name] is not value):
                k += 1
                value.name = f"{base}__{k}"
            graph.register_initializer(value)
            names.add(value.name)


def _nonnegative_axes(model) -> None:
    """Constant negative axes of Reduce* nodes (the `axes` input) and of ArgMax / ArgMin (the
    `axis` attribute) written as non-negative: the input's rank is static. ONNX Runtime 1.31
    returns an EMPTY input to a reduction unchanged when an axis is negative (measured for
    ReduceSum/Mean/Max/Prod/L2/SumSquare/LogSumExp and ArgMax: `x.sum(-1)` of a (2, 3, 0) tensor
    came back (2, 3, 0), eager zeros of (2, 3)); with the same axes as non-negative numbers it
    reduces correctly. (torchlib's amax / amin functions: explicit_reduction_dims.py.)"""
    import numpy as np
    import onnx_ir as ir
    fixed_axes: dict[tuple[int, int], object] = {}
    for node in model.graph:
        if node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None \
                or node.inputs[0].shape is None:
            continue
        rank = len(node.inputs[0].shape)
        if node.op_type in ("ArgMax", "ArgMin"):
            axis = node.attributes.get("axis")
            if axis is not None and axis.as_int() < 0:
                node.attributes["axis"] = ir.AttrInt64("axis", axis.as_int() + rank)
            continue
        if not node.op_type.startswith("Reduce") or len(node.inputs) < 2:
            continue
        axes = node.inputs[1]
        if axes is None or axes.const_value is None:
            continue
        values = axes.const_value.numpy()
        if not (values < 0).any():
            continue
        fixed = fixed_axes.get((id(axes), rank))
        if fixed is None:   # one per (axes, rank): reductions share their axes constants
            fixed = fixed_axes[(id(axes), rank)] = ir.Value(
                name=f"{axes.name}__rank{rank}", shape=axes.shape, type=axes.type,
                const_value=ir.tensor(np.where(values < 0, values + rank, values).astype(np.int64)))
            model.graph.register_initializer(fixed)
        node.replace_input_with(1, fixed)


def _outputs_from_nodes(model) -> None:
    """Graph outputs that constant folding turned into initializers (or that are graph inputs)
    get an Identity node: ONNX Runtime rejects a graph output no node produces."""
    import onnx_ir as ir
    graph = model.graph
    for i, value in enumerate(list(graph.outputs)):
        if value.producer() is None:
            node = ir.node("Identity", [value], num_outputs=1)
            graph.append(node)
            out = node.outputs[0]
            out.name, out.shape, out.type = f"{value.name}__out", value.shape, value.type
            graph.outputs[i] = out


def _outputs_in_declared_dtypes(model, sub: GraphModule) -> None:
    """A graph output whose ONNX type is not the cluster's dtype for it gets a Cast. torch.onnx
    (torch 2.13) loses the cast back of an op its type promotion computes in float32 when that op
    is a graph output: `(x * 3 + x).abs()` on float16 came out float32 (the op's result is
    float32 math rounded to float16 either way, so the Cast is what torch computes)."""
    import onnx_ir as ir
    out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    declared = [getattr(o.meta.get("val"), "dtype", None) if isinstance(o, torch.fx.Node) else None
                for o in (out if isinstance(out, (tuple, list)) else (out,))]
    graph, ir_dtypes = model.graph, _ir_dtypes()
    for i, (value, dtype) in enumerate(zip(list(graph.outputs), declared)):
        want = ir_dtypes.get(dtype)
        if want is None or value.dtype is None or value.dtype == want:
            continue
        node = ir.node("Cast", [value], attributes={"to": want}, num_outputs=1)
        graph.append(node)
        cast = node.outputs[0]
        cast.name, cast.shape, cast.dtype = f"{value.name}__as_{dtype}".replace("torch.", ""), value.shape, want
        graph.outputs[i] = cast


def _ir_dtypes() -> dict:
    """torch dtype -> onnx_ir DataType, for the dtypes the onnxruntime capability compiles."""
    import onnx_ir as ir
    return {torch.float32: ir.DataType.FLOAT, torch.float64: ir.DataType.DOUBLE, torch.float16: ir.DataType.FLOAT16,
            torch.int8: ir.DataType.INT8, torch.uint8: ir.DataType.UINT8, torch.int16: ir.DataType.INT16,
            torch.int32: ir.DataType.INT32, torch.int64: ir.DataType.INT64, torch.bool: ir.DataType.BOOL}


def _constants_by_input(ep: torch.export.ExportedProgram) -> dict:
    """Placeholder name (= the ONNX value name during translation) -> constant contents."""
    sig, state = ep.graph_signature, {**ep.state_dict, **ep.constants}
    names = {**sig.inputs_to_buffers, **sig.inputs_to_parameters, **sig.inputs_to_lifted_tensor_constants}
    return {ph: state[target].detach().numpy() for ph, target in names.items() if target in state}


def _first_cause(exc: BaseException) -> str:
    """The innermost exception's message: torch.onnx wraps the real cause several times."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def _flatten_rows(model: onnx.ModelProto) -> onnx.ModelProto:
    graph = model.graph
    shapes = {}
    for vi in [*graph.value_info, *graph.input, *graph.output]:
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = tuple(d.dim_value for d in dims)
    nodes, inits = flatten_rows(list(graph.node), list(graph.initializer), shapes, {o.name for o in graph.output})
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in nodes for i in n.input} | {o.name for o in graph.output}
    kept = [t for t in inits if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model


def fx_nodes_of(model_bytes: bytes, name: str, op_type: str, sub: GraphModule) -> list[str]:
    """The cluster's FX nodes calling the ATen op the ONNX node `name` was translated from
    (torch.onnx's `pkg.torch.onnx.fx_node` metadata); where an engine names no node (or one
    inside a function body), those of every node of type `op_type`. Used by onnxruntime and
    openvino to refuse what their engine rejected."""
    import onnx
    graph = onnx.load_from_string(model_bytes).graph
    nodes = [n for n in graph.node if n.name == name] if name else []
    nodes = nodes or [n for n in graph.node if n.op_type == op_type]
    targets = set()
    for node in nodes:
        fx_node = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.fx_node"), "")
        targets.update(re.findall(r"target=([\w.]+)", fx_node)[:1])
    return [n.name for n in sub.graph.nodes if n.op == "call_function" and target_text(n.target) in targets]


def target_text(target) -> str:
    """How torch.onnx's fx_node metadata writes a call's target (torch.ops.aten.conv2d.default)."""
    return f"torch.ops.{target}" if isinstance(target, torch._ops.OpOverload) else str(target)
