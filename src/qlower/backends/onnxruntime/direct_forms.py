"""Before a cluster is translated (translate._prepared_for_onnx): ops that torch's decomposition
would only rename are renamed in place, so a cluster holding them is translated as it stands
instead of being re-traced whole by `run_decompositions` (measured on the AMD EPYC Zen 1: the
re-trace was 13 s of a 66 s int8 compile of the BERT-base-size encoder; HuggingFace's mask code
is what brings `to` and `&` into every BERT, GPT-2 and LLaMA cluster).

Preconditions: an ExportedProgram's graph module (a re-captured cluster).
BEFORE:  y = aten.to.dtype(x, torch.bool)            (to.dtype_layout, to.device: on the CPU,
                                                       strided, no memory format or pinning)
         z = aten.__and__.Tensor(a, b)                (__or__, __xor__; .Scalar likewise)
AFTER:   y = aten._to_copy.default(x, dtype=torch.bool)
         z = aten.bitwise_and.Tensor(a, b)
Near misses left alone: any `to` in a graph that also holds an in-place op (`to` returns its
input itself when nothing changes, so `y = x.to(x.dtype); y.add_(1)` changes x in eager, and a
copy would not: that graph keeps the full decomposition, which functionalizes it); a `to` to
another device or layout, or with a memory format.
Postconditions: values identical (each op has its target's values; the bitwise ops are ATen's
aliases). Idempotent: nothing renamed is left.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

BITWISE_ALIASES = {
    aten.__and__.Tensor: aten.bitwise_and.Tensor, aten.__and__.Scalar: aten.bitwise_and.Scalar,
    aten.__or__.Tensor: aten.bitwise_or.Tensor, aten.__or__.Scalar: aten.bitwise_or.Scalar,
    aten.__xor__.Tensor: aten.bitwise_xor.Tensor, aten.__xor__.Scalar: aten.bitwise_xor.Scalar,
}
TO_OPS = {aten.to.dtype, aten.to.dtype_layout, aten.to.device}


def rename_to_direct_forms(graph_module: torch.fx.GraphModule) -> int:
    """Rename what can be renamed (module docstring); the number of nodes renamed."""
    graph = graph_module.graph
    calls = [n for n in graph.nodes if n.op == "call_function"]
    in_place = any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable for n in calls)
    renamed = 0
    for node in calls:
        if node.target in BITWISE_ALIASES:
            node.target = BITWISE_ALIASES[node.target]
            renamed += 1
        elif node.target in TO_OPS and not in_place:
            dtype = _plain_cpu_conversion(node)
            if dtype is not False:
                node.target, node.args = aten._to_copy.default, (node.args[0],)
                node.kwargs = {} if dtype is None else {"dtype": dtype}
                renamed += 1
    if renamed:
        graph_module.recompile()
    return renamed


def _plain_cpu_conversion(node: torch.fx.Node):
    """The dtype a `to` node converts to (None: unchanged), or False where it does more than
    convert a CPU tensor's dtype (another device or layout, a memory format, pinned memory)."""
    schema = node.target._schema
    bound = {a.name: (a.default_value if a.has_default_value() else None) for a in schema.arguments}
    bound.update(zip((a.name for a in schema.arguments), node.args))
    bound.update(node.kwargs)
    device = bound.get("device")
    if device is not None and torch.device(device).type != "cpu":
        return False
    if bound.get("layout") not in (None, torch.strided) or bound.get("pin_memory"):
        return False
    if bound.get("memory_format") not in (None, torch.preserve_format):
        return False
    return bound.get("dtype")
