"""Small FX helpers shared by passes and backends: constants, shape metadata, Q/DQ recognition."""
from __future__ import annotations

import contextlib
import copy
import os
import warnings

import torch
from torch._guards import detect_fake_mode
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


def mutated_in_place(node: Node) -> bool:
    """Whether some op writes into this value (module state such as a KV cache)."""
    for user in node.users:
        schema = getattr(user.target, "_schema", None)
        if user.op == "call_function" and schema is not None and schema.is_mutable and user.args \
                and user.args[0] is node:
            return True
    return False


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


def fake_mode_of(gm: GraphModule):
    vals = [n.meta["val"] for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    return detect_fake_mode(vals)


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
