"""FunctionalizeState: in-place writes to module state become functional ops plus one
write-back per buffer at the end of the graph.

`ep.module()` keeps in-place ops on module state (KV caches written with `index_copy_`,
counters bumped with `add_`, `copy_` into buffers). In place, each one is a hard boundary for
clustering and a hazard for constant folding. Here every such write is replaced by its
functional twin, later readers of the buffer read the new value, and the buffer is written
once, by `copy_`, just before the output — so the state semantics are unchanged while the
computation in between is pure and clusters as one piece.

Preconditions: the mutated argument is a get_attr buffer or the result of an earlier in-place
op on one (an alias of it).
BEFORE:  k = get_attr cache;  w = aten.index_copy_(k, 2, pos, new);  y = sdpa(q, w, ...)
AFTER:   k = get_attr cache;  w = aten.index_copy(k, 2, pos, new);   y = sdpa(q, w, ...)
         ...;  aten.copy_(k, w);  return ...
Aliases are followed: the result of an in-place op, and `to`/`alias` of it without a dtype
change (transformers bumps a cache counter through `counter.copy_(p).to(int64).add_(1)`).
In-place ops on private temporaries (results of non-view ops) become functional too, without
a write-back. Not fired: in-place ops on graph inputs or on views; in-place ops without a
functional twin of the same overload (left as they are).
Postconditions: each mutated buffer has exactly one mutation, a final `copy_`; running the
graph leaves the buffers as before. Idempotent (a final copy_ is not rewritten again).
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ..fx import call
from .base import Pass, PassContext


def _functional_twin(target):
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.is_mutable or not target.namespace == "aten":
        return None
    name = schema.name.split("::")[-1]
    if not name.endswith("_"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    return getattr(packet, target._overloadname, None) if packet is not None else None


WRITE_BACK = "qlower.write_back"   # meta flag on the final copy_ nodes this pass adds


def _is_noop_view(node: Node) -> bool:
    """An op that returns its input itself (an alias), e.g. `to` without a dtype change."""
    if node.target in (torch.ops.aten.alias.default, torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout):
        src, val = node.args[0].meta.get("val"), node.meta.get("val")
        return src is not None and val is not None and src.dtype == val.dtype
    return False


def _is_final_write_back(node: Node) -> bool:
    return node.meta.get(WRITE_BACK, False)


def _private_temporary(node) -> bool:
    """A value computed inside the graph that is not a view of anything (so writing into it is
    visible only through it): the result of a non-view call."""
    if not isinstance(node, Node) or node.op != "call_function" or _is_noop_view(node):
        return False
    schema = getattr(node.target, "_schema", None)
    if schema is None or schema.is_mutable:
        return False
    return not any(r.alias_info for r in schema.returns)  # views return an alias of an input


class FunctionalizeState(Pass):
    name = "functionalize_state"

    @staticmethod
    def _functionalize_temporary(gm: GraphModule, node: Node, twin, order: dict) -> None:
        """x.add_(1) on a temporary x: y = x + 1, and x's later readers read y."""
        base = node.args[0]
        with gm.graph.inserting_before(node):
            new = call(gm, twin, node.args, node.kwargs, like=node)
        node.replace_all_uses_with(new)
        position = order[node]
        for user in list(base.users):
            if user is not new and order.get(user, -1) > position:
                user.replace_input_with(base, new)
        gm.graph.erase_node(node)
        order[new] = position

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        graph = gm.graph
        alias_of: dict[Node, Node] = {}      # value -> the get_attr buffer it is (a version of)
        latest: dict[Node, Node] = {}        # get_attr buffer -> its current value
        order = {n: i for i, n in enumerate(graph.nodes)}
        for node in list(graph.nodes):
            if node.op != "call_function" or not node.args or _is_final_write_back(node):
                continue
            if _is_noop_view(node) and node.args[0] in alias_of:  # x.to(same dtype) is x itself
                alias_of[node] = alias_of[node.args[0]]
                continue
            twin = _functional_twin(node.target)
            base = node.args[0]
            buffer = base if getattr(base, "op", None) == "get_attr" else alias_of.get(base)
            if twin is not None and buffer is None and _private_temporary(base):
                self._functionalize_temporary(gm, node, twin, order)
                ctx.rewrites[f"{node.target.name()} on a temporary made functional"] += 1
                continue
            if twin is None or buffer is None:
                continue
            with graph.inserting_before(node):
                new = call(gm, twin, (latest.get(buffer, buffer), *node.args[1:]), node.kwargs, like=node)
            node.replace_all_uses_with(new)
            position = order[node]
            views = [buffer] + [v for v, b in alias_of.items() if b is buffer]
            for view in views:  # later readers of the buffer, or of any alias of it, see the write
                for user in list(view.users):
                    if user is not new and order.get(user, -1) > position:
                        user.replace_input_with(view, new)
            graph.erase_node(node)
            order[new] = position
            alias_of[new], latest[buffer] = buffer, new
            ctx.rewrites[f"{node.target.name()} made functional"] += 1
        output = next(n for n in graph.nodes if n.op == "output")  # write-backs go last
        for buffer, value in latest.items():
            with graph.inserting_before(output):
                write = graph.call_function(torch.ops.aten.copy_.default, (buffer, value))
                write.meta["val"], write.meta[WRITE_BACK] = buffer.meta.get("val"), True
        return bool(latest)
