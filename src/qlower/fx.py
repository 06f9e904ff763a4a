"""Small FX helpers shared by passes and backends: constants, shape metadata, Q/DQ recognition."""
from __future__ import annotations

import contextlib
import functools
import operator
import copy
import os
import warnings
import weakref
from dataclasses import dataclass

import torch
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import GraphModule, Node
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed ops)

qd = torch.ops.quantized_decomposed
QUANTIZE_OPS = {qd.quantize_per_tensor.default, qd.quantize_per_tensor.tensor,
                qd.quantize_per_channel.default}
DEQUANTIZE_OPS = {qd.dequantize_per_tensor.default, qd.dequantize_per_tensor.tensor,
                  qd.dequantize_per_channel.default}

def is_quantize(node) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in QUANTIZE_OPS


def is_dequantize(node) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in DEQUANTIZE_OPS


def _alias_args(node: Node):
    """(argument node, written?) for each argument `node` aliases per its schema (Tensor(a) or
    Tensor(a!)): a view returns an alias of the first kind, an in-place op writes the second."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None:
        return
    for arg, formal in zip(node.args, schema.arguments):
        if isinstance(arg, Node) and formal.alias_info is not None:
            yield arg, formal.alias_info.is_write


def _aliases_and_writers(node: Node) -> tuple[set[Node], list[Node]]:
    """The views of `node` (transitively, itself included) and the ops writing into any of them."""
    aliases, writers, stack = {node}, [], [node]
    while stack:
        value = stack.pop()
        for user in value.users:
            for arg, written in _alias_args(user):
                if arg is not value:
                    continue
                if written:
                    writers.append(user)
                elif user not in aliases:   # the op returns a view of `value`
                    aliases.add(user)
                    stack.append(user)
    return aliases, writers


def mutated_in_place(node: Node) -> bool:
    """Whether some op writes into this value (module state such as a KV cache), directly or
    through a view of it (`embedding_renorm_(detach(weight), ...)`, as nn.Embedding(max_norm=)
    exports: the embedding that reads the weight afterwards must see the written values)."""
    return bool(_aliases_and_writers(node)[1])


@dataclass
class MutationHazards:
    """What partitioning must respect about in-place writes that data edges do not carry."""
    after: dict[Node, list[Node]]   # node -> ops it must follow (write before read, read before write)
    pinned: dict[Node, str]         # views that an op writes through: they must stay PyTorch views


def mutation_hazards(graph) -> MutationHazards:
    """A node reading a value (or a view of it) after an in-place op wrote it depends on that op,
    and the op depends on the readers before it; a view written through must stay a view of the
    value (an engine would compute a copy, and the write would miss the value)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    hazards = MutationHazards({}, {})
    for root in graph.nodes:
        if root.op not in ("placeholder", "get_attr"):
            continue
        aliases, writers = _aliases_and_writers(root)
        if not writers:
            continue
        for view in aliases - {root}:
            hazards.pinned[view] = (f"a view of {root.name} that {schema_name(writers[0])} writes into: "
                                    "stays in PyTorch")
        readers = {u for a in aliases for u in a.users if u not in aliases}
        for writer in writers:
            for reader in readers - {writer}:
                if order[reader] > order[writer]:
                    hazards.after.setdefault(reader, []).append(writer)
                else:
                    hazards.after.setdefault(writer, []).append(reader)
    return hazards


def mutated_attributes(gm: GraphModule) -> set[str]:
    """get_attr targets the graph writes in place (module state such as caches)."""
    return {str(n.target) for n in gm.graph.nodes if n.op == "get_attr" and mutated_in_place(n)}


def constant_value(gm: GraphModule, node) -> torch.Tensor | None:
    """The tensor behind a get_attr node, or None for anything that is not a constant (including
    module state that the graph writes)."""
    if not isinstance(node, Node) or node.op != "get_attr" or mutated_in_place(node):
        return None
    obj = gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, torch.Tensor) else None


def rank_of(x) -> int | None:
    """The rank of a node's tensor value (None: not a node, or not a tensor)."""
    val = x.meta.get("val") if isinstance(x, Node) else None
    return val.dim() if isinstance(val, torch.Tensor) else None


def fake_mode_of(gm: GraphModule):
    """The fake mode of gm's values: the first fake value's (one graph has one mode), or the
    active one. Asked on every node a pass inserts: reading every node's value each time made
    a pass quadratic (measured: 0.62 s of an 8 s int8 compile of the zoo transformer)."""
    first = next((v for v in (n.meta.get("val") for n in gm.graph.nodes) if isinstance(v, FakeTensor)), None)
    return detect_fake_mode([first] if first is not None else [])


def add_constant(gm: GraphModule, tensor: torch.Tensor, hint: str) -> Node:
    """Register `tensor` as a buffer of gm and return a get_attr node for it (inserted at the
    current insertion point), with meta['val'] set."""
    index = 0
    while hasattr(gm, f"_qlower_{hint}_{index}"):
        index += 1
    name = f"_qlower_{hint}_{index}"
    gm.register_buffer(name, tensor.detach().clone(), persistent=True)
    node = gm.graph.get_attr(name)
    mode = fake_mode_of(gm)
    node.meta["val"] = mode.from_tensor(tensor, static_shapes=True) if mode is not None else tensor
    return node


def _fake_arg(a, mode):
    if isinstance(a, Node):
        return a.meta["val"]
    if isinstance(a, (list, tuple)):
        return type(a)(_fake_arg(x, mode) for x in a)
    return a


def infer_val(node: Node, gm: GraphModule) -> None:
    """Compute node.meta['val'] by running its target on the fake values of its inputs."""
    mode = fake_mode_of(gm)
    args = _fake_arg(node.args, mode)
    kwargs = {k: _fake_arg(v, mode) for k, v in node.kwargs.items()}
    if mode is None:
        node.meta["val"] = node.target(*args, **kwargs)
        return
    with mode:
        node.meta["val"] = node.target(*args, **kwargs)


def node_tensors(node: Node) -> list[torch.Tensor]:
    """The tensors a node makes and reads (its meta["val"] and its inputs'), tuples left out."""
    values = (node.meta.get("val"), *(a.meta.get("val") for a in node.all_input_nodes))
    return [v for v in values if isinstance(v, torch.Tensor)]


def tensor_dtype(value) -> torch.dtype | None:
    """The dtype of the tensor a node computes (its meta["val"]), or None."""
    val = value.meta.get("val") if isinstance(value, Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def call(gm: GraphModule, target, args, kwargs=None, like: Node | None = None) -> Node:
    """Insert a call_function node at the current insertion point with meta['val'] computed,
    carrying stack_trace from `like` so errors still point at the user's source line."""
    node = gm.graph.call_function(target, tuple(args), kwargs or {})
    if like is not None and "stack_trace" in like.meta:
        node.meta["stack_trace"] = like.meta["stack_trace"]
    infer_val(node, gm)
    return node


def source_of(node: Node) -> str | None:
    """The last user-code frame of a node's stack trace ("file:line"), if recorded."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    frames = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith("File ")]
    users = [f for f in frames if f"{os.sep}torch{os.sep}" not in f]   # not torch.nn's own forward
    return (users or frames)[-1] if frames else None


def schema_of(node: Node) -> str:
    """Full schema string of a call_function node's op (e.g. 'aten::add.Tensor(Tensor self, ...)')."""
    schema = getattr(node.target, "_schema", None)
    return str(schema) if schema is not None else str(node.target)


def schema_name(node: Node) -> str:
    """'ns::name.overload' for an OpOverload target ('ns::name' for the default overload)."""
    return target_schema_name(node.target)


def target_schema_name(target) -> str:
    """schema_name of an op target (OpOverload, or a Python function such as operator.getitem)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return str(getattr(target, "__name__", target))
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


def splice(gm: GraphModule, sub: torch.fx.Graph, inputs: list, before: Node, copy) -> object:
    """Copy `sub`'s call_function nodes into gm's graph before `before`, its placeholders bound
    to `inputs`; `copy(node, env)` makes each new node (e.g. graph.node_copy, or qlower.fx.call
    to re-infer meta['val']). Returns what sub's output returns, in terms of the new nodes;
    get_attr nodes of sub are handed to `copy` as well."""
    env: dict[Node, Node] = {}
    bound = iter(inputs)
    result = None
    with gm.graph.inserting_before(before):
        for node in sub.nodes:
            if node.op == "placeholder":
                env[node] = next(bound)
            elif node.op in ("call_function", "get_attr"):
                env[node] = copy(node, env)
            elif node.op == "output":
                result = torch.fx.node.map_arg(node.args[0], env.__getitem__)
    return result


def replace_results(node: Node, result) -> None:
    """Point node's readers at what replaces it: `result` itself (a Node) for a single value,
    or, for a tuple-returning node, each `getitem(node, i)` reader's slot result[i] (the getitems
    are erased)."""
    if isinstance(result, Node):
        node.replace_all_uses_with(result)
        return
    for user in list(node.users):
        assert user.target is operator.getitem, user
        user.replace_all_uses_with(result[user.args[1]])
        user.graph.erase_node(user)


def full_args(node: Node) -> list:
    """A call's positional arguments with everything torch.export may drop filled back in from
    the op's schema: trailing arguments equal to their defaults, and keyword arguments. Reading
    `node.args[8]` directly is how a dropped default became an IndexError after save/load."""
    schema = getattr(node.target, "_schema", None)
    args = list(node.args)
    if schema is None:
        return args
    for arg in schema.arguments[len(args):]:
        if arg.name in node.kwargs:
            args.append(node.kwargs[arg.name])
        elif arg.has_default_value():
            args.append(arg.default_value)
        elif arg.kwarg_only:
            break
        else:
            raise ValueError(f"{schema.name}: argument {arg.name!r} missing on node {node.name}")
    return args


@contextlib.contextmanager
def torch_deprecation_silenced():
    """torch 2.13 prints a FutureWarning ("isinstance(treespec, LeafSpec) is deprecated") from
    its own pytree code on every copy / re-export of an exported module: not the user's to fix."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        yield


def copy_graph_module(gm: GraphModule) -> GraphModule:
    """A deep copy of gm (without torch's own deprecation noise)."""
    with torch_deprecation_silenced():
        return copy.deepcopy(gm)


# ------------------------------------------------------------------ memory of discarded graphs
def _generated_code_key(gm: GraphModule) -> str | None:
    code = getattr(type(gm).forward, "__code__", None)   # each GraphModule has its own class
    return None if code is None else code.co_filename


def _graph_modules_in(result) -> list[GraphModule]:
    """The GraphModules a result holds: an ExportedProgram's or CompiledModule's graph module
    and its submodules (clusters keep their PyTorch fallback graphs as submodules)."""
    root = getattr(result, "graph_module", result)
    return [m for m in root.modules() if isinstance(m, GraphModule)] if isinstance(root, torch.nn.Module) else []


def _drop_module_keyed_caches() -> None:
    """torchao's and torch.ao's `assert_and_get_unique_device` are `lru_cache(maxsize=None)`
    keyed by the module: every model quantized in a process stayed alive there, observers and
    calibration tensors included (measured: 54 FX nodes and 30 tensors per tiny int8 model)."""
    import torch.ao.quantization.fx.utils as ao_utils
    import torchao.utils as tao_utils
    for fn in (getattr(tao_utils, "_assert_and_get_unique_device", None),
               getattr(ao_utils, "assert_and_get_unique_device", None)):
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()


# FakeTensorMode's dispatch cache (class-level, never trimmed by torch) gains ~12 entries per
# int8 compile of a small model and holds them for good: cleared past this many entries (a cache
# miss only recomputes a fake kernel)
FAKE_DISPATCH_CACHE_LIMIT = 4096


def _trim_fake_dispatch_cache(limit: int) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    if len(FakeTensorMode.cache) > limit:
        FakeTensorMode.cache_clear()


def _forget_source(key: str) -> None:
    import linecache
    from torch.fx.graph_module import _loader
    _loader.eval_cache.pop(key, None)
    linecache.cache.pop(key, None)


def forgets_discarded_graphs(fn):
    """Decorator for an entry point that builds and throws away GraphModules (capture,
    quantization, passes, clustering). torch.fx keeps the generated Python source of every
    GraphModule it ever compiled (`torch.fx.graph_module._loader.eval_cache`, plus a linecache
    entry) for tracebacks, and never drops it: a process compiling models one after another grew
    without bound (a fuzz run: 4.8 GB after 10,000 examples, 170 -> 60 examples a minute). After
    the call, the source of every GraphModule created during it and not reachable from its result
    is forgotten (the code objects stay valid; only `inspect.getsource` of a discarded module
    would notice), the third-party caches keyed by a module are emptied, and FakeTensorMode's
    dispatch cache is cleared once past FAKE_DISPATCH_CACHE_LIMIT entries. A compile running
    in another thread meanwhile loses at most the source lines of its tracebacks and some cache
    hits, never a result."""
    from torch.fx.graph_module import _loader

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = set(_loader.eval_cache)
        result = None
        try:
            result = fn(*args, **kwargs)
            return result
        finally:
            keep = set()
            for gm in _graph_modules_in(result):
                key = _generated_code_key(gm)
                if key in _loader.eval_cache and key not in before:
                    keep.add(key)
                    weakref.finalize(gm, _forget_source, key)   # and once the result is gone
            for key in set(_loader.eval_cache) - before - keep:
                _forget_source(key)
            _drop_module_keyed_caches()
            _trim_fake_dispatch_cache(FAKE_DISPATCH_CACHE_LIMIT)
    return wrapper
