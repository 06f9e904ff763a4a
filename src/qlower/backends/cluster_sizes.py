"""Sizes at cluster boundaries (dynamic shapes): no cluster takes or returns a size.

A size (`sym_size`, arithmetic on SymInts) read by two clusters, or computed in one cluster and
read in another, would cross the boundary as a Python int: ONNX and MLIR functions take
tensors, so torch.export could not re-capture such a cluster (`'SymInt' object has no
attribute 'shape'`, the T5 encoder on OpenVINO) and a cluster returning a size could not run on
an engine at all. Instead:

1. `one_user_per_size`: every size computation gets one user (a copy per extra user), so
2. `sizes_with_their_users`: clustering keeps each size with the op that reads it (a size whose
   user is outside its cluster is computed in PyTorch, where it costs nothing);
3. `derive_sizes`: a size a cluster still takes as an input is computed inside it from its
   tensor inputs' dims (`sym_size` of an input with that very size expression, or sums /
   products of such); a size that is none of these (data-dependent, `item()`) stays an input
   and the cluster says why it cannot be translated.
"""
from __future__ import annotations

import operator

import torch
from torch.fx import Graph, GraphModule, Node

from ..fx import schema_name

SIZE_OPS = ("aten::sym_size.int", *(f.__name__ for f in (operator.add, operator.sub, operator.mul, operator.floordiv,
                                                          operator.mod, operator.neg)))


class SizeInputError(NotImplementedError):
    """A cluster's size input cannot be computed from its tensor inputs."""


def is_size(node) -> bool:
    """A node computing a size (sym_size, arithmetic on SymInts): an integer scalar, no tensor."""
    return isinstance(node, Node) and node.op == "call_function" and schema_name(node) in SIZE_OPS \
        and isinstance(node.meta.get("val"), (int, torch.SymInt))


def one_user_per_size(gm: GraphModule) -> None:
    """Give every size computation one user: a copy per extra user, so that clustering can keep
    each with the op that reads it. Idempotent."""
    for node in reversed(list(gm.graph.nodes)):
        users = list(node.users)
        if not is_size(node) or len(users) < 2:
            continue
        for user in users[1:]:
            with gm.graph.inserting_after(node):
                copy = gm.graph.node_copy(node)
            copy.meta = dict(node.meta)
            user.replace_input_with(node, copy)
    gm.graph.lint()


def sizes_with_their_users(clusters: list[list[Node]]) -> list[list[Node]]:
    """Leave a size computation out of its cluster (PyTorch computes it) when its one user is
    not in that cluster; a cluster then never returns a size. A cluster left with sizes only is
    dropped."""
    out = []
    for nodes in clusters:
        kept = set(nodes)
        for node in reversed(nodes):
            if is_size(node) and any(u not in kept for u in node.users):
                kept.discard(node)
        if any(not is_size(n) for n in kept):
            out.append([n for n in nodes if n in kept])
    return out


def computable_from(val, symbols: frozenset) -> bool:
    """`val` (a SymInt) is an integer, symbol, or sum / product of `symbols` (what `size_node`
    builds, and the IREE TOSA emitter's `Builder.index` computes at run time: keep them in step)."""
    import sympy
    expr = getattr(getattr(val, "node", None), "expr", None)
    if expr is None:
        return False
    return all(isinstance(a, (sympy.Symbol, sympy.Integer, sympy.Add, sympy.Mul))
               for a in sympy.preorder_traversal(expr)) \
        and expr.free_symbols <= symbols


def derive_sizes(sub: GraphModule, runtime_args: list) -> list:
    """Compute every size input of cluster `sub` inside it (`size_node`) and drop it from the
    inputs; returns the outer arguments left (the call's args for the placeholders that remain).
    Raises SizeInputError, before `sub` changes, when a size cannot be derived."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    tensors = [(ph, ph.meta.get("val")) for ph in placeholders if isinstance(ph.meta.get("val"), torch.Tensor)]
    sizes = [ph for ph in placeholders if not isinstance(ph.meta.get("val"), torch.Tensor)]
    for ph in sizes:
        if _dim_source(ph.meta["val"], tensors) is None and not computable_from(ph.meta["val"], _dim_symbols(tensors)):
            raise SizeInputError(f"size input {ph.name} = {ph.meta['val']} is neither a dim of a tensor input of the "
                                 f"cluster nor a sum / product of such dims")
    if not sizes:
        return runtime_args
    first = next(iter(sub.graph.nodes))   # placeholders first (fused graphs interleave them), in order
    if first is not placeholders[0]:
        first.prepend(placeholders[0])
    for before, ph in zip(placeholders, placeholders[1:]):
        before.append(ph)
    body = placeholders[-1].next   # sizes computed in order, before the first op
    for ph in sizes:
        with sub.graph.inserting_before(body):
            size = size_node(sub.graph, ph.meta["val"], tensors)
        ph.replace_all_uses_with(size)
        sub.graph.erase_node(ph)
    sub.graph.lint()
    sub.recompile()
    return [outer for ph, outer in zip(placeholders, runtime_args) if ph not in sizes]


def derive_sizes_of_clusters(fused: GraphModule) -> dict[str, str]:
    """`derive_sizes` for every `cluster_<i>` call of `fused`, its args updated (the caller
    recompiles `fused`). Returns the clusters whose size inputs stay (call target -> why)."""
    left = {}
    for call in fused.graph.nodes:
        if call.op == "call_module" and str(call.target).startswith("cluster_"):
            try:
                call.args = tuple(derive_sizes(getattr(fused, call.target), list(call.args)))
            except SizeInputError as exc:
                left[str(call.target)] = str(exc)
    return left


def _dim_source(val, tensors) -> tuple[Node, int] | None:
    """(tensor input, dim) whose size is the symbolic size `val`, or None."""
    return next(((t, i) for t, v in tensors for i, d in enumerate(v.shape) if str(d) == str(val)), None)


def _dim_symbols(tensors) -> frozenset:
    return frozenset(d.node.expr for _, v in tensors for d in v.shape
                     if hasattr(d, "node") and d.node.expr.is_Symbol)


def size_node(graph: Graph, val, tensors):
    """A node computing size `val` in `graph` from the tensor inputs' dims: `sym_size` of the
    input with that very size, else sums / products of such (MobileViT's `32*batch`, torch.fx
    operator.add / mul on SymInts); an int when static."""
    import sympy
    expr = sympy.sympify(getattr(getattr(val, "node", None), "expr", val))
    if expr.is_Integer:
        return int(expr)
    source = next(((t, i) for t, v in tensors for i, d in enumerate(v.shape)
                   if getattr(getattr(d, "node", None), "expr", None) == expr), None)
    if source is not None:
        node = graph.call_function(torch.ops.aten.sym_size.int, source)
        node.meta["val"] = source[0].meta["val"].shape[source[1]]
        return node
    if not (expr.is_Add or expr.is_Mul):
        raise SizeInputError(f"size {expr} is not a sum / product of the cluster's input dims")
    combine = operator.mul if expr.is_Mul else operator.add
    terms = [size_node(graph, t, tensors) for t in expr.args]
    node = terms[0]
    for term in terms[1:]:
        value = combine(_meta_value(node), _meta_value(term))
        node = graph.call_function(combine, (node, term))
        node.meta["val"] = value
    return node


def _meta_value(size):
    return size.meta["val"] if isinstance(size, Node) else size
