"""Float clusters through the ecosystem's importer: torch's FX importer (shipped with
iree-base-compiler as iree.compiler.extras.fx_importer) turns the cluster's FX graph into the
torch dialect, which IREE lowers itself (`--iree-input-type=torch`). qlower keeps no ATen->MLIR
table: whatever the importer and IREE cannot handle makes the cluster fall back, with the
compiler's message as the reason."""
from __future__ import annotations

import operator
import re

import torch
from torch.fx import GraphModule, Node

from ...fx import constant_value, schema_name
from ...shapes import finite_bound
from .values import EmittedModule
from ..cluster_sizes import computable_from
from .tosa_ops import emits_float_shape_op


def import_float_cluster(sub: GraphModule):
    """torch-dialect MLIR of `sub` (constants are get_attr nodes, imported as literals), with
    each symbolic size's range (`torch.symbolic_int` / `torch.bind_symbolic_shape`, which IREE's
    torch input pipeline turns into `util.assume.int` bounds).

    Why the ranges: without them IREE compiles every dynamic dim for any size up to 2^63.
    Measured on a MiniLM-size encoder (hidden 384, 2 layers, mean pooling), batch and
    sequence dynamic, at 8 x 40, one thread, Intel Xeon, with the cluster compiled
    without data tiling: 82.7 ms without, 53.3 ms with (static module: 22.8 ms). With the
    global-optimization data tiling (26 ms) the ranges' own share is within the
    noise (27-56 ms for either, eager varying as much)."""
    from iree.compiler.extras.fx_importer import FxImporter
    importer = FxImporter()
    ranges = symbol_ranges(sub.graph)
    if ranges:
        importer._cc._symbolic_guards = ranges   # import_program's own route reads an ExportedProgram's
    importer.import_stateless_graph(sub.graph, func_name="main", import_symbolic_shape_expressions=bool(ranges))
    inputs = [n.meta["val"] for n in sub.graph.nodes if n.op == "placeholder"]
    out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    single = not isinstance(out, (tuple, list))
    outs = [out] if single else list(out)
    return EmittedModule(str(importer.module_op), [v.dtype for v in inputs],
                         [o.meta["val"].dtype for o in outs], single)


_UNBOUNDED = 2 ** 62   # a symbol with no finite upper bound: as the importer writes int_oo (about)


def symbol_ranges(graph: torch.fx.Graph) -> dict:
    """symbol name -> the importer's RangeConstraint (0, max) for every symbol in the sizes of
    `graph`'s values, max read from their ShapeEnv (the declared Dim's max, narrowed by
    torch.export's guards; the runner refuses a size above it). The lower bound is not passed
    on: the ShapeEnv says 2 for a `Dim(min=1)` (torch.export's 0/1 specialization) while qlower
    runs size 1 too, and IREE may compile on what it is told (`util.assume.int`)."""
    from iree.compiler.extras.fx_importer import RangeConstraint
    found = {}
    for node in graph.nodes:
        val = node.meta.get("val")
        sizes = val.shape if isinstance(val, torch.Tensor) else [val] if isinstance(val, torch.SymInt) else []
        for size in sizes:
            if not isinstance(size, torch.SymInt):
                continue
            env = size.node.shape_env
            for symbol in size.node.expr.free_symbols:
                bounds = env.var_to_range.get(symbol)
                if bounds is not None and str(symbol) not in found:
                    upper = finite_bound(bounds.upper)
                    upper = _UNBOUNDED if upper is None else upper
                    found[str(symbol)] = RangeConstraint(0, upper)   # lower: see the docstring
    return found


# torch-mlir's own lowering of the torch dialect to linalg on builtin tensors (registered in
# iree-base-compiler's Python PassManager): how a float op joins a TOSA module (see docs/iree.md).
# Its TMTensor ops (attention, scan, sort, ...) are then converted to IREE's LinalgExt, which the
# TOSA input pipeline accepts (left as tm_tensor.* they failed to legalize: the int8 cluster of
# OPT / MPNet with a `cumsum` of the mask, an encoder's dynamic-shape attention).
_TO_LINALG = ("builtin.module(torch-function-to-torch-backend-pipeline,"
              "torch-backend-to-linalg-on-tensors-backend-pipeline,"
              "func.func(torch-iree-tm-tensor-to-linalg-ext))")


def _one_node_graph(sub: GraphModule, node: Node) -> tuple[GraphModule, list[Node]]:
    """`node` alone as a GraphModule: its constant inputs as get_attr (imported as literals),
    the others as placeholders — a symbolic size none of its inputs has (`arange(seq)`) too, as
    an integer argument the TOSA module computes from its own arguments' dims. Returns it and
    the runtime inputs, in placeholder order."""
    owner = torch.nn.Module()
    graph = torch.fx.Graph()
    env: dict[Node, Node] = {}
    runtime: list[Node] = []
    sizes = [a for a in node.all_input_nodes if not isinstance(a.meta.get("val"), torch.Tensor)]
    for i, arg in enumerate(node.all_input_nodes):
        if arg in sizes:
            continue
        value = constant_value(sub, arg)
        if value is not None:
            owner.register_buffer(f"c{i}", value)
            env[arg] = graph.get_attr(f"c{i}")
        else:
            env[arg] = graph.placeholder(f"in{i}")
            runtime.append(arg)
        env[arg].meta["val"] = arg.meta["val"]
    for i, arg in enumerate(sizes):
        if _passed_in(node, arg.meta.get("val"), len(sizes)) and _may_pass_sizes(node):
            env[arg] = graph.placeholder(f"size{i}")
            env[arg].meta["val"] = arg.meta["val"]
            runtime.append(arg)
    for arg in sizes:
        if arg not in env:
            env[arg] = _size_in(graph, node, arg, env, len(sizes))
    copy = graph.node_copy(node, lambda a: env[a])
    copy.meta["val"] = node.meta["val"]
    if isinstance(node.meta["val"], (tuple, list)):   # a list result (unbind, split): a tuple of
        picks = []                                    # tensors, which the linalg pipeline takes
        for i, v in enumerate(node.meta["val"]):
            picks.append(graph.call_function(operator.getitem, (copy, i)))
            picks[-1].meta["val"] = v
        graph.output(tuple(picks))
    else:
        graph.output(copy)
    return GraphModule(owner, graph), runtime


_INFERRED = ("aten::view", "aten::reshape", "aten::_unsafe_view")   # infer one size given as -1


def _size_source(node: Node, val) -> tuple[Node, int] | None:
    """(tensor input of `node`, dim) whose size is the symbolic size `val`, or None."""
    for a in node.all_input_nodes:
        t = a.meta.get("val")
        if isinstance(t, torch.Tensor):
            for i, d in enumerate(t.shape):
                if str(d) == str(val):
                    return a, i
    return None


def _inferred(node: Node, count: int) -> bool:
    """The op's one symbolic size can be given as -1 (a view of a known element count)."""
    return count == 1 and schema_name(node) in _INFERRED and -1 not in list(node.args[1])


# Ops whose symbolic size arguments may be passed in as integers: measured to compile and match
# (position ids and masks: `arange(seq)`, `position_ids[:, :seq]`). Not expand: passed its sizes
# it makes MPNet's int8 cluster fail in iree-compile; qlower emits float
# expands and reshapes itself instead (tosa_ops.float_shape_op: the failure
# is tensor.reshape hiding sizes from IREE, see Builder.reshape).
_SIZES_PASSED_IN = ("aten::arange", "aten::slice")


def _passed_in(node: Node, val, count: int) -> bool:
    """A symbolic size argument the lone op cannot compute from its own inputs."""
    return isinstance(val, torch.SymInt) and _size_source(node, val) is None and not _inferred(node, count)


def _may_pass_sizes(node: Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.name in _SIZES_PASSED_IN


def not_importable_alone(node: Node, available: frozenset = frozenset()) -> str | None:
    """Why float op `node` cannot be a private function of a TOSA module, or None (found at
    compile time it would take its whole int8 cluster to PyTorch, so it is refused while clustering): a
    symbolic size argument that is none of its own inputs' dims and that the module cannot
    compute either — `available`: the symbols its cluster's tensor inputs have as dims (BERT's
    `position_ids[:, :input_ids.shape[1]]`, `arange(seq)`: passed in as integer arguments when
    the cluster reads a tensor of that length).

    (Ops torch-mlir lowers to TMTensor — attention, cumsum's scan, sort — fail as they are:
    "failed to legalize 'tm_tensor.attention'", "'tensor.dim' op unexpected during shape
    cleanup". `_TO_LINALG` converts them to IREE's LinalgExt, as IREE's own torch input
    pipeline does, and they compile and match.)"""
    if emits_float_shape_op(node, available):   # not imported: the TOSA emitter reshapes it
        return None
    if _broadcast_batch_matmul(node):
        return ("a rank-3 matmul broadcasting a dynamic batch (torch-mlir cannot decompose it alone; "
                "equal batches run as bmm)")
    sizes = [a for a in node.all_input_nodes if not isinstance(a.meta.get("val"), torch.Tensor)]
    for arg in sizes:
        val = arg.meta.get("val")
        if _passed_in(node, val, len(sizes)) and not (_may_pass_sizes(node) and computable_from(val, available)):
            return (f"a size argument ({val}) that is neither a dim of its inputs nor of the integer (TOSA) "
                    f"cluster's inputs (float ops are imported one at a time)")
    return None


def _broadcast_batch_matmul(node: Node) -> bool:
    """A rank-3 x rank-3 `aten.matmul` with a dynamic batch dim: torch-mlir fails on it alone
    (measured: [1, S, S] @ [B, S, 16] and [B, S, S] @ [1, S, 16]); the equal-batch ones are bmm
    by then (MatmulToBmm)."""
    if schema_name(node) != "aten::matmul":
        return False
    vals = [a.meta.get("val") for a in node.all_input_nodes[:2]]
    return len(vals) == 2 and all(isinstance(v, torch.Tensor) and v.dim() == 3 for v in vals) and \
        any(not isinstance(v.shape[0], int) for v in vals)


def input_symbols(nodes) -> frozenset:
    """The symbols the tensor inputs of a cluster (`nodes`) have as whole dims: the sizes a TOSA
    module can read from its arguments (TosaEmitter binds them)."""
    inside = set(nodes)
    found = set()
    for n in nodes:
        for a in n.all_input_nodes:
            val = a.meta.get("val")
            if a in inside or not isinstance(val, torch.Tensor):
                continue
            for d in val.shape:
                expr = getattr(getattr(d, "node", None), "expr", None)
                if expr is not None and expr.is_Symbol:
                    found.add(expr)
    return frozenset(found)


def _size_in(graph: torch.fx.Graph, node: Node, arg: Node, env: dict, count: int):
    """A size argument of `node` (dynamic shapes), recomputed in its one-node graph: a literal
    when it is static, `sym_size` of an input with that very size, or -1 where the op infers one
    size; else NotImplementedError (`not_importable_alone` refuses such a node before clustering
    ends; the cluster falls back with it as the reason)."""
    val = arg.meta.get("val")
    if isinstance(val, int):
        return int(val)
    source = _size_source(node, val)
    if source is not None and source[0] in env:
        size = graph.call_function(torch.ops.aten.sym_size.int, (env[source[0]], source[1]))
        size.meta["val"] = val
        return size
    if _inferred(node, count):
        return -1
    raise NotImplementedError(f"{node.name}: size argument {val} is not a dim of its inputs")


def float_node_function(sub: GraphModule, node: Node, name: str):
    """A private func.func `name` computing `node` on builtin tensors, in the current MLIR
    context (parsed and ready to move into the caller's module), and its runtime inputs."""
    functions, module = float_node_functions(sub, [(node, name)])
    fn, runtime = functions[node]
    return fn, runtime, module


def float_node_functions(sub: GraphModule, named: list[tuple[Node, str]]):
    """`float_node_function` for many nodes at once: each node imported alone as its own
    function of one module, torch-mlir's pipeline run on that module once. A run costs ~0.2 s
    whatever the module holds (measured, one thread: 40 lone SiLUs 0.41 s together, 0.2 s each
    alone; hf-llama int8 on IREE spent 9.7 of its 27.8 s compile importing 40 float ops one by
    one). Returns ({node: (private func.func, runtime inputs)}, the module: keep it alive until
    the functions are moved out)."""
    from iree.compiler import ir, passmanager
    from iree.compiler.extras.fx_importer import FxImporter
    importer = FxImporter(context=ir.Context.current, config_check=False)
    runtimes = {}
    for node, name in named:
        gm, runtimes[node] = _one_node_graph(sub, node)
        importer.import_stateless_graph(gm.graph, func_name=name)
    module = importer.module
    passmanager.PassManager.parse(_TO_LINALG).run(module.operation)
    by_name = {ir.StringAttr(op.attributes["sym_name"]).value: op for op in module.body.operations
               if op.operation.name == "func.func"}
    functions = {}
    for node, name in named:
        fn = by_name[name]
        _check_no_specialized_dims(fn, node)
        fn.operation.attributes["sym_visibility"] = ir.StringAttr.get("private")
        functions[node] = (fn, runtimes[node])
    return functions, module


_CAST = re.compile(r"tensor\.cast %arg\d+ : tensor<([^>]*)> to tensor<([^>]*)>")


def _check_no_specialized_dims(fn, node: Node) -> None:
    """Raise when torch-mlir's lowering of the lone op casts an argument's dynamic dim to a
    static size: measured, `view(x, [-1, 64])` of x [?, ?, 64] became a cast to [?, 1, 64] —
    silently wrong at every other size. The TOSA emitter reshapes float tensors itself;
    this keeps any other such lowering from reaching a module (the cluster falls back)."""
    for source, target in _CAST.findall(str(fn)):
        src, dst = source.split("x")[:-1], target.split("x")[:-1]
        if len(src) == len(dst) and any(a == "?" and b != "?" for a, b in zip(src, dst)):
            raise NotImplementedError(f"{node.name}: torch-mlir's lowering fixes a dynamic dim "
                                      f"(tensor<{source}> cast to tensor<{target}>)")
