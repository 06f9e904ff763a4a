"""DecomposeBlockOps: replace the block ops a backend cannot run by their ATen decomposition.

A backend's legalization pass (its `legalize_passes()`, run by backends/base.py `compile_graph`
on the backend's own copy of the graph), not in the default pipeline:
block ops stay single nodes everywhere else, and only a backend that lacks one pays for the
pieces. `supported(node)` is the backend's capability test.

Preconditions: meta['val'] on every input of the block op.
BEFORE:  y = qlower.rotary_embedding(x, cos, sin, True)             # backend: unsupported
AFTER:   x1 = aten.slice(x, -1, 0, None, 2)  ...  y = aten.add(aten.mul(x, cos), ...)
         (the op's entry in qlower.blockops.DECOMPOSITIONS, traced on the node's values)
Not fired: block ops the backend supports; ops without a decomposition (lstm, gru); block ops
whose inputs have symbolic shapes and whose decomposition uses one of those sizes (traced with
prime stand-ins for the symbolic sizes, a stand-in found among the traced ops' arguments: the
trace would bake one size in) — those keep the op, which then runs in PyTorch, and a refusal
records why. A decomposition that never reads a symbolic size (LayerNorm / RMSNorm over a
static last dim) is inlined under symbolic shapes too.
Postconditions: no unsupported block op with a decomposition and static shapes remains; the
graph computes the decomposition, which tests hold equal to the op's reference kernel.
Idempotent: the ATen ops it inserts are not block ops.
Each inserted node is tagged (`DECOMPOSED_FROM`) so that a cluster the engine cannot run can call
the block op again in PyTorch (`recompose_block_ops`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.fx import GraphModule, Node
from torch.fx.experimental.proxy_tensor import make_fx

from ..blockops.ops import DECOMPOSITIONS
from ..fx import add_constant, call, splice
from .base import Pass, PassContext


def _static(val) -> bool:
    return not isinstance(val, torch.Tensor) or all(isinstance(d, int) for d in val.shape)


def _trace(node: Node, decomposition: Callable, sizes: dict | None = None) -> GraphModule:
    """The decomposition as an ATen graph whose placeholders are node's tensor arguments
    (non-tensor keyword arguments are passed as they are); `sizes` gives each symbolic size
    of the inputs a concrete stand-in."""
    tensor_positions = [i for i, a in enumerate(node.args) if isinstance(a, Node)]

    def bound(*tensors):
        args = list(node.args)
        for i, t in zip(tensor_positions, tensors):
            args[i] = t
        return decomposition(*args, **node.kwargs)
    examples = [_example_like(node.args[i].meta["val"], sizes) for i in tensor_positions]
    return make_fx(bound)(*examples)


# Stand-ins for symbolic sizes while tracing (with real tensors): primes, so a multiple of one
# among the traced ops' arguments means the decomposition baked a size in (a static size that
# happens to be a multiple only refuses more). Small: primes near 1000 made causal attention's
# traced scores [1009, 1, 1013, 1013] — 4 GB and 32 s in its test.
_STAND_INS = (17, 19, 23, 29, 31, 37)


def _symbolic_stand_ins(node: Node) -> dict | None:
    """sympy symbol -> stand-in size for every symbol in node's input shapes, or None when
    there are more symbols than stand-ins."""
    symbols = []
    for a in node.all_input_nodes:
        val = a.meta.get("val")
        for d in (val.shape if isinstance(val, torch.Tensor) else ()):
            expr = getattr(getattr(d, "node", None), "expr", None)
            for sym in (getattr(expr, "free_symbols", None) or ()):
                if sym not in symbols:
                    symbols.append(sym)
    return dict(zip(symbols, _STAND_INS)) if len(symbols) <= len(_STAND_INS) else None


def _bakes_a_size(traced: GraphModule, sizes: dict) -> bool:
    """Whether any traced op takes a multiple of a stand-in size (the size, or a product with
    it: a flattened view) as an argument."""
    def ints(arg):
        if isinstance(arg, (list, tuple)):
            return [i for x in arg for i in ints(x)]
        return [arg] if isinstance(arg, int) and not isinstance(arg, bool) else []
    for n in traced.graph.nodes:
        args = ints(list(n.args) + list(n.kwargs.values())) if n.op == "call_function" else []
        if any(i != 0 and i % s == 0 for i in args for s in sizes.values()):
            return True
    return False


def _example_like(val: torch.Tensor, sizes: dict | None = None) -> torch.Tensor:
    """A zero tensor with val's shape AND strides: traced on a contiguous example, a reshape is
    recorded as a view, which then fails on the real (e.g. permuted) input (fuzz: group_norm on
    a permuted activation raised a raw ValueError on iree). Symbolic sizes take their stand-ins
    (`sizes`), contiguous."""
    if all(isinstance(d, int) for d in (*val.shape, *val.stride())):
        return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype).zero_()
    shape = [d if isinstance(d, int) else int(d.node.expr.subs(sizes)) for d in val.shape]
    return torch.zeros(shape, dtype=val.dtype)


# meta key on every call a decomposition inserted: (its Recompose, its position in the decomposition)
DECOMPOSED_FROM = "qlower.decomposed_from"


@dataclass(eq=False)   # identity: the copies of one decomposition's nodes share one record
class Recompose:
    """How to call a decomposed block op again: its target, its arguments with tensor argument k
    written `_Input(k)`, and each inserted node as it was inserted (`_shape`), so a decomposition
    a later pass changed (its matmuls lowered to integer ops, say) is told apart and left alone."""
    target: object
    args: tuple
    kwargs: dict
    nodes: tuple           # per inserted node: (target, its argument leaves as `_shape` writes them)
    result: int            # the position of the node whose value is the block op's


@dataclass(frozen=True)
class _Input:
    index: int


@dataclass(frozen=True)
class _Member:
    position: int


_OTHER = "<another node>"   # a node of the graph neither an input nor inserted (a constant)


def _leaves(node: Node) -> list:
    return torch.utils._pytree.tree_leaves((node.args, node.kwargs))


def _shape(node: Node, members: dict[Node, int], inputs: dict[Node, int]) -> tuple:
    def leaf(a):
        if not isinstance(a, Node):
            return a
        return _Member(members[a]) if a in members else _Input(inputs[a]) if a in inputs else _OTHER
    return node.target, tuple(leaf(a) for a in _leaves(node))


def _inline(gm: GraphModule, node: Node, traced: GraphModule) -> Node:
    inputs = [a for a in node.args if isinstance(a, Node)]
    inserted: list[Node] = []

    def copy(t: Node, env: dict) -> Node:
        if t.op == "get_attr":
            return add_constant(gm, getattr(traced, t.target), "decomposed")
        new = call(gm, t.target, torch.fx.node.map_arg(t.args, env.__getitem__),
                   torch.fx.node.map_arg(t.kwargs, env.__getitem__), like=node)
        inserted.append(new)
        return new
    result = splice(gm, traced.graph, inputs, node, copy)
    _tag(node, inputs, inserted, result)
    return result


def _tag(node: Node, inputs: list[Node], inserted: list[Node], result) -> None:
    """Record on the inserted nodes how `node` is called again (`recompose_block_ops`); nothing
    when its value is not one inserted node or a tensor input appears twice."""
    if not isinstance(result, Node) or result not in inserted or len(set(inputs)) != len(inputs):
        return
    members = {n: i for i, n in enumerate(inserted)}
    numbered = {n: k for k, n in enumerate(inputs)}
    args = tuple(_Input(numbered[a]) if isinstance(a, Node) else a for a in node.args)
    record = Recompose(node.target, args, dict(node.kwargs),
                       tuple(_shape(n, members, numbered) for n in inserted), members[result])
    for i, n in enumerate(inserted):
        n.meta[DECOMPOSED_FROM] = (record, i)


def _intact_inputs(record: Recompose, members: dict[int, Node]) -> list[Node] | None:
    """The block op's tensor inputs if every inserted node is in the graph once, as inserted
    (same target, same arguments up to which node is an input); else None."""
    if len(members) != len(record.nodes):
        return None
    position = {n: p for p, n in members.items()}
    found: dict[int, Node] = {}
    for p, (target, recorded) in enumerate(record.nodes):
        node = members[p]
        actual = _leaves(node)
        if node.target != target or len(actual) != len(recorded):
            return None
        for want, got in zip(recorded, actual):
            if isinstance(want, _Input):
                if not isinstance(got, Node) or got in position or found.setdefault(want.index, got) is not got:
                    return None
            elif isinstance(want, _Member):
                if position.get(got) != want.position:
                    return None
            elif want is _OTHER:
                if not isinstance(got, Node) or got in position:
                    return None
            elif isinstance(got, Node) or not _same_literal(want, got):
                return None
    n_inputs = sum(isinstance(a, _Input) for a in record.args)
    return [found[k] for k in range(n_inputs)] if len(found) == n_inputs else None


def _same_literal(a, b) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:   # noqa: BLE001  (a value without a plain ==)
        return False


def recompose_block_ops(gm: GraphModule) -> bool:
    """The inverse of DecomposeBlockOps, for a graph PyTorch runs (a cluster's fallback): each
    decomposition still in `gm` as it was inserted becomes the block op's call again, whose
    kernel is the one eager and the reference backend run. Why: the decomposition's fp32
    roundings differ from the kernel's (a LayerNorm's mean of a constant row one ulp off,
    amplified by 1 / sqrt(eps) into a different int8 code: fuzz, iree, a NaN input whose rows
    reached the norm as constants). A decomposition split across clusters or changed by a later
    pass (its matmuls lowered to integer ops: the program then computes something else) stays.
    Returns whether it changed gm."""
    groups: dict[int, tuple[Recompose, dict[int, Node]]] = {}
    for n in gm.graph.nodes:
        tag = n.meta.get(DECOMPOSED_FROM)
        if tag is not None:
            record, members = groups.setdefault(id(tag[0]), (tag[0], {}))
            members[tag[1]] = None if tag[1] in members else n   # twice: not as inserted
    changed = False
    for record, members in groups.values():
        inputs = None if None in members.values() else _intact_inputs(record, members)
        if inputs is None:
            continue
        result = members[record.result]
        args = tuple(inputs[a.index] if isinstance(a, _Input) else a for a in record.args)
        with gm.graph.inserting_before(result):
            block = gm.graph.call_function(record.target, args, record.kwargs)
        block.meta = {k: v for k, v in result.meta.items() if k != DECOMPOSED_FROM}
        result.replace_all_uses_with(block)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return changed


class DecomposeBlockOps(Pass):
    name = "decompose_block_ops"

    def __init__(self, supported: Callable[[Node], bool], why: str = "", table: dict | None = None):
        self.supported = supported
        self.why = f" ({why})" if why else ""   # the report line's reason, e.g. "(iree lacks it)"
        # op -> decomposition: the block ops' own by default; a backend may pass ATen ops it lacks
        self.table = DECOMPOSITIONS if table is None else table

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target not in self.table or self.supported(node):
                continue
            if any(isinstance(a, Node) for a in node.kwargs.values()):
                ctx.refuse(self.name, node, "a tensor keyword argument: the op runs as it is")
                continue
            sizes = None
            if not all(_static(a.meta.get("val")) for a in node.all_input_nodes):
                sizes = _symbolic_stand_ins(node)
            traced = _trace(node, self.table[node.target], sizes) if sizes is not None or \
                all(_static(a.meta.get("val")) for a in node.all_input_nodes) else None
            if traced is None or (sizes and _bakes_a_size(traced, sizes)):
                ctx.refuse(self.name, node, "symbolic input shapes and a decomposition that depends on "
                                            "them: the block op runs in PyTorch")
                continue
            result = _inline(gm, node, traced)
            node.replace_all_uses_with(result)
            gm.graph.erase_node(node)
            ctx.rewrites[f"decomposed {node.target.name()}{self.why}"] += 1
            changed = True
        if changed:
            gm.graph.eliminate_dead_code()
            gm.recompile()
        return changed
