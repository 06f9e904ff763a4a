"""Before a cluster is translated (translate._prepared_for_onnx): ops whose decomposition by
torch.onnx's table is one op torchlib translates are replaced by that op in place, so a cluster
holding them is translated as it stands instead of being re-traced whole by
`run_decompositions` (measured on the AMD EPYC Zen 1: the re-trace was 13 s of a 66 s int8
compile of the BERT-base-size encoder, where HuggingFace's mask code brings `to` and `&` into
every BERT, GPT-2 and LLaMA cluster, and ~2.4 s of a 7.5 s fp32 compile of the zoo MobileNet:
eval-mode batch norm, global average pooling).

Preconditions: an ExportedProgram's graph module (a re-captured cluster).
BEFORE:  y = aten.to.dtype(x, torch.bool)            (to.dtype_layout, to.device: on the CPU,
                                                       strided, no memory format or pinning)
         z = aten.__and__.Tensor(a, b)                (__or__, __xor__; .Scalar likewise)
         y = aten.batch_norm(x, w, b, rm, rv, False, momentum, eps, cudnn)   (eval mode, with
                                                                             running statistics)
         y = aten.adaptive_avg_pool2d(x, [1, 1])
         y = aten.index_copy(x, d, index, src)        (1-D index, src of x's rank: a KV cache write)
AFTER:   y = aten._to_copy.default(x, dtype=torch.bool)
         z = aten.bitwise_and.Tensor(a, b)
         y = getitem(aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, momentum, eps), 0)
         y = aten.mean.dim(x, [-1, -2], True)
         y = aten.scatter.src(x, d, expand(view(index, [1.., -1, ..1]), src's sizes), src)
         (each but the last the op torch.onnx's decomposition makes of it: tests/test_direct_forms.py
         compares; index_copy it decomposes into index_put, which torchlib writes as Transpose ->
         ScatterND -> Transpose: one ScatterElements along d instead, the same values, and no
         re-trace of the cluster: 11.7 s of the 38 s ONNX Runtime compile of SmolLM2's int4
         decode step, under cProfile)
Near misses left alone: any `to` in a graph that also holds an in-place op (`to` returns its
input itself when nothing changes, so `y = x.to(x.dtype); y.add_(1)` changes x in eager, and a
copy would not: that graph keeps the full decomposition, which functionalizes it); a `to` to
another device or layout, or with a memory format; batch norm in training mode or without
running statistics; adaptive average pooling to any other size; index_copy with a 0-d index.
Postconditions: the graph torch.onnx's decomposition would make of these nodes (the bitwise ops
are ATen's aliases). Idempotent: a second call replaces nothing.
"""
from __future__ import annotations

import operator

import torch

from ..fx import call, full_args

aten = torch.ops.aten

BITWISE_ALIASES = {
    aten.__and__.Tensor: aten.bitwise_and.Tensor, aten.__and__.Scalar: aten.bitwise_and.Scalar,
    aten.__or__.Tensor: aten.bitwise_or.Tensor, aten.__or__.Scalar: aten.bitwise_or.Scalar,
    aten.__xor__.Tensor: aten.bitwise_xor.Tensor, aten.__xor__.Scalar: aten.bitwise_xor.Scalar,
}
TO_OPS = {aten.to.dtype, aten.to.dtype_layout, aten.to.device}


def rename_to_direct_forms(graph_module: torch.fx.GraphModule) -> int:
    """Replace what the module docstring lists; the number of nodes replaced."""
    graph = graph_module.graph
    calls = [n for n in graph.nodes if n.op == "call_function"]
    in_place = any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable for n in calls)
    renamed = 0
    for node in calls:
        if node.target is aten.batch_norm.default and _eval_with_running_statistics(node):
            _batch_norm_no_training(graph_module, node)
            renamed += 1
        elif node.target is aten.adaptive_avg_pool2d.default and list(node.args[1]) == [1, 1]:
            node.target, node.args = aten.mean.dim, (node.args[0], [-1, -2], True)
            renamed += 1
        elif node.target is aten.index_copy.default and _rank_preserving_index_copy(node):
            _index_copy_as_scatter(graph_module, node)
            renamed += 1
        elif node.target in BITWISE_ALIASES:
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
    bound = _by_name(node)
    device = bound.get("device")
    if device is not None and torch.device(device).type != "cpu":
        return False
    if bound.get("layout") not in (None, torch.strided) or bound.get("pin_memory"):
        return False
    if bound.get("memory_format") not in (None, torch.preserve_format):
        return False
    return bound.get("dtype")


def _by_name(node: torch.fx.Node) -> dict:
    """A call's arguments by their schema names, defaults filled in (fx.full_args)."""
    return dict(zip((a.name for a in node.target._schema.arguments), full_args(node)))


def _eval_with_running_statistics(node: torch.fx.Node) -> bool:
    args = _by_name(node)
    return args["training"] is False and args["running_mean"] is not None and args["running_var"] is not None


def _batch_norm_no_training(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    """The node itself becomes the getitem: its name is what an ExportedProgram's signature
    calls a graph output (a new node in its place made torch.onnx raise KeyError)."""
    a = _by_name(node)
    with graph_module.graph.inserting_before(node):
        norm = call(graph_module, aten._native_batch_norm_legit_no_training.default,
                    (a["input"], a["weight"], a["bias"], a["running_mean"], a["running_var"], a["momentum"], a["eps"]),
                    like=node)
    node.target, node.args, node.kwargs = operator.getitem, (norm, 0), {}


def _rank_preserving_index_copy(node: torch.fx.Node) -> bool:
    a = _by_name(node)
    vals = [getattr(a[k], "meta", {}).get("val") for k in ("self", "index", "source")]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return False
    x, index, source = vals
    return index.dim() == 1 and source.dim() == x.dim() >= 1


def _index_copy_as_scatter(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    """x.index_copy(d, index, src) writes src[.., i, ..] to x[.., index[i], ..]: scatter with
    index viewed along d and expanded to src's sizes (symbolic ones read with sym_size)."""
    a = _by_name(node)
    source = a["source"]
    sizes = list(source.meta["val"].shape)
    dim = a["dim"] % len(sizes)
    with graph_module.graph.inserting_before(node):
        index = call(graph_module, aten.view.default,
                     (a["index"], [-1 if d == dim else 1 for d in range(len(sizes))]), like=node)
        sizes = [s if isinstance(s, int) else call(graph_module, aten.sym_size.int, (source, d), like=node)
                 for d, s in enumerate(sizes)]
        index = call(graph_module, aten.expand.default, (index, sizes), like=node)
    node.target, node.args, node.kwargs = aten.scatter.src, (a["self"], dim, index, source), {}
