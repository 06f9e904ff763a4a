"""`qlower.export(cm, path, format="onnx", onnx_ops=...)`: the whole model as one ONNX file,
whatever backend `cm` was compiled for.

The file is lowered from the model's quantized program (`cm.graph_module`, the program after
qlower's pass pipeline and before any backend's legalization, which a CompiledModule keeps and a
loaded one reads back from its .pt2), through ONNX Runtime's clustering, so it is a model ONNX
Runtime has just accepted:

- onnx_ops="standard" (default): standard `ai.onnx` operators only (`onnx/standard.py`:
  integer ops as ConvInteger / MatMulInteger / QuantizeLinear / DequantizeLinear / Gather
  tables, block ops inlined), for any ONNX consumer (ONNX Runtime, OpenVINO, ...). Numerics:
  qlower's canonical integer arithmetic as ONNX defines these ops; how far ONNX Runtime and
  OpenVINO (where installed) are from qlower's own output is measured on the model's example
  inputs at export and written into the file's metadata (`export_checks.py`).
- onnx_ops="qdq": the quantized program before qlower's integer lowering (`qdq_program`),
  QuantizeLinear / DequantizeLinear around float ops in standard operators: the form int8 ONNX
  consumers (ONNX Runtime, OpenVINO, TensorRT) fuse into their own kernels, with their own
  rounding (measured, not bounded, in the metadata). Needs the Q/DQ program, which a model
  compiled in this process keeps and a loaded one does not.
- onnx_ops="onnxruntime": ONNX Runtime's fused contrib kernels (com.microsoft QGemm,
  QLinearAdd, ...) where proven exact, the form the onnxruntime backend runs: bit-exact with
  qlower on ONNX Runtime, unreadable by other consumers. A model compiled for onnxruntime
  exports its own session's model.

Only a model that is ONE cluster exports (anything else needs qlower's PyTorch glue between
engine calls): otherwise a BackendError names the nodes outside it. The graph takes the model's
flat inputs by their argument names and returns its outputs under the names of its output
structure (`onnx/io_names.py`); symbolic dims of a model compiled with dynamic shapes stay
symbolic. The NaN-check sums the backend adds to its sessions are not in the file."""
from __future__ import annotations

from pathlib import Path

import onnx

from ...artifact import atomic_write
from ...errors import BackendError, QlowerError
from ...onnx.io_names import input_names, output_names, unique
from ...onnx.standard import non_standard_domains
from ...passes import (IntegerLayerNorm, IntegerRMSNorm, IntegerSoftmax, LowerDynamicLinear, LowerPerTokenLinear,
                       LowerQDQ, PassContext, PassManager, default_pipeline)
from ..base import compile_graph, whole_model
from .. import export_checks

ONNX_OPS = ("standard", "onnxruntime", "qdq")
# the passes that turn Q/DQ patterns into qlower's integer ops: the Q/DQ form runs the pipeline without them
QDQ_LOWERINGS = (LowerPerTokenLinear, LowerDynamicLinear, LowerQDQ, IntegerLayerNorm, IntegerRMSNorm, IntegerSoftmax)


def qdq_program(cm):
    """cm's quantized program through the default pipeline without its integer lowerings: Q/DQ
    nodes around float ops (tables and folded constants as usual), or a BackendError for a model
    that keeps no quantized program (loaded from a .pt2, or not quantized)."""
    ep = getattr(cm, "quantized_program", None)
    if ep is None:
        raise BackendError("onnx_ops='qdq' needs the quantized program of a model quantized by qlower.compile in "
                           "this process (a loaded .pt2 keeps the lowered program only; a float model has no Q/DQ)",
                           hint="export onnx_ops='standard' (qlower's integer program in standard ONNX operators)")
    gm = ep.module()
    passes = [p for p in default_pipeline() if not isinstance(p, QDQ_LOWERINGS)]
    PassManager(passes).run(gm, PassContext(profile=cm.report().profile))
    return gm
PRODUCER = "qlower"


def whole_model_onnx(cm, onnx_ops: str, backends: dict) -> tuple[onnx.ModelProto, object]:
    """(the whole model as one ONNX model, with the model's input and output names and order;
    the ONNX Runtime cluster that runs it), or a BackendError naming what prevents it.
    `backends`: onnx_ops -> the backend class that translates into it (`StandardOnnxBackend`
    for "standard", `OnnxRuntimeBackend` for "onnxruntime")."""
    if onnx_ops not in ONNX_OPS:
        raise QlowerError(f"unknown onnx_ops {onnx_ops!r}", hint=f"use one of {ONNX_OPS}")
    if onnx_ops == "onnxruntime" and cm.backend == "onnxruntime":
        executable = cm._executable   # the model the backend runs
    elif onnx_ops == "qdq":
        executable = compile_graph(backends[onnx_ops](), qdq_program(cm))
    else:
        executable = compile_graph(backends[onnx_ops](), cm.graph_module)
    whole = whole_model(executable, "onnxruntime", "ONNX graph")
    if whole.info.onnx is None:
        raise BackendError("the model's cluster kept no ONNX model (it computes constants only)",
                           hint="export it as .pt2")
    model = onnx.load_from_string(whole.info.onnx)
    named(model, whole, input_names(cm.graph_module), output_names(cm.graph_module), _input_types(cm.graph_module))
    _name_dims(model, getattr(cm, "_dynamic_shapes", None))
    _drop_unused_initializers(model.graph)
    return model, whole.cluster


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    """Initializers no node reads (constants a rewrite replaced) removed: ONNX Runtime warns
    about each one when a session loads the file."""
    used = {o.name for o in graph.output}

    def reads(g: onnx.GraphProto) -> None:
        for node in g.node:
            used.update(node.input)
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    used.update(o.name for o in sub.output)
                    reads(sub)
    reads(graph)
    kept = [t for t in graph.initializer if t.name in used]
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)


def _name_dims(model: onnx.ModelProto, dynamic_shapes) -> None:
    """Symbolic dims named as the user's `torch.export.Dim`s ("batch", "seq") instead of the
    capture's symbols ("s41"): read from each input's declared Dims, renamed throughout the
    graph's inputs, outputs and value infos. Dims without a name (Dim.AUTO) keep theirs."""
    if not isinstance(dynamic_shapes, (tuple, list)) or len(dynamic_shapes) != len(model.graph.input):
        return
    renames: dict[str, str] = {}
    for vi, spec in zip(model.graph.input, dynamic_shapes):
        axes = spec.items() if isinstance(spec, dict) else enumerate(spec) if isinstance(spec, (tuple, list)) else ()
        dims = vi.type.tensor_type.shape.dim
        for axis, dim in axes:
            name = getattr(dim, "__name__", None)
            if not isinstance(axis, int) or not 0 <= axis < len(dims) or not isinstance(name, str) \
                    or not dims[axis].dim_param:
                continue
            if renames.setdefault(dims[axis].dim_param, name) != name:
                return   # one symbol, two names: the capture's symbols stay
    if len(set(renames.values())) != len(renames):
        return
    graph = model.graph
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]


def _input_types(gm) -> list[int]:
    """The ONNX element type of each placeholder (an input the cluster does not read keeps its type)."""
    import torch
    types = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            val = n.meta.get("val")
            dtype = val.dtype if isinstance(val, torch.Tensor) else torch.float32
            types.append(onnx.helper.np_dtype_to_tensor_dtype(torch.empty((), dtype=dtype).numpy().dtype)
                         if dtype != torch.bfloat16 else onnx.TensorProto.BFLOAT16)
    return types


def named(model: onnx.ModelProto, whole, inputs: list[str], outputs: list[str], types: list[int]) -> None:
    """Rename the cluster's graph inputs and outputs to the model's names, in the model's order:
    input k of the cluster is the model's input whole.args[k]; output i of the model is the
    cluster's output whole.outputs[i] (an output returned twice gets an Identity); a model input
    the cluster does not read stays a graph input of its own (ONNX allows unused inputs)."""
    graph = model.graph
    inputs = list(inputs)
    outputs = unique(list(inputs) + list(outputs))[len(inputs):]
    renames = {graph.input[k].name: inputs[j] for k, j in enumerate(whole.args)}
    given = {j: graph.input[k] for k, j in enumerate(whole.args)}
    cluster_outputs = list(graph.output)
    taken = set(renames.values()) | set(outputs)

    def fresh(name: str) -> str:   # an internal value whose name a model name now takes
        k = 0
        while f"{name}__{k}" in taken:
            k += 1
        taken.add(f"{name}__{k}")
        return f"{name}__{k}"
    internal = {v for n in graph.node for v in [*n.input, *n.output]} | {t.name for t in graph.initializer}
    for name in sorted(taken):   # an inner value holding a name the model's inputs or outputs take
        if name in internal and name not in renames:
            renames[name] = fresh(name)
    new_outputs, produced = [], {}
    for i, k in enumerate(whole.outputs):
        value = cluster_outputs[k]
        if value.name in produced:   # the same value returned twice: an Identity names the copy
            graph.node.append(onnx.helper.make_node("Identity", [produced[value.name]], [outputs[i]]))
        else:
            produced[value.name] = outputs[i]
            renames[value.name] = outputs[i]
        out = onnx.ValueInfoProto()
        out.CopyFrom(value)
        out.name = outputs[i]
        new_outputs.append(out)
    _rename_values(graph, renames)
    ordered = []
    for j, name in enumerate(inputs):
        vi = onnx.ValueInfoProto()
        if j in given:
            vi.CopyFrom(given[j])
        else:
            vi.name = name
            vi.type.tensor_type.elem_type = types[j]
        vi.name = name
        ordered.append(vi)
    del graph.input[:]
    graph.input.extend(ordered)
    del graph.output[:]
    graph.output.extend(new_outputs)


def _rename_values(graph: onnx.GraphProto, renames: dict[str, str]) -> None:
    if not renames:
        return
    for node in graph.node:
        node.input[:] = [renames.get(v, v) for v in node.input]
        node.output[:] = [renames.get(v, v) for v in node.output]
        for attr in node.attribute:   # subgraphs (If / Loop / Scan) read outer values by name
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _rename_values(sub, renames)
    for t in graph.initializer:
        t.name = renames.get(t.name, t.name)
    for vi in graph.value_info:
        vi.name = renames.get(vi.name, vi.name)


def export_onnx(cm, path: Path, onnx_ops: str, backends: dict) -> Path:
    """Write the whole model's ONNX to `path` (atomically), with the numerics it carries in its
    metadata, checked by `onnx.checker` (full check); or a BackendError naming what prevents it."""
    model, _ = whole_model_onnx(cm, onnx_ops, backends)
    if onnx_ops != "onnxruntime":
        stray = non_standard_domains(model)
        if stray:   # translate_standard's contract; never write a file that breaks it
            raise BackendError(f"the standard-op translation left operators of domain(s) {sorted(stray)}",
                               hint="export with onnx_ops='onnxruntime' for ONNX Runtime")
    model.producer_name = PRODUCER
    export_checks.describe(model, cm, onnx_ops, backends["onnxruntime"]().options.disabled_optimizers)
    onnx.checker.check_model(model, full_check=True)
    atomic_write(path, lambda tmp: tmp.write_bytes(model.SerializeToString()))   # typed error, never half a file
    return path
