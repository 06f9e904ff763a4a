"""Clustering: group supported nodes into cycle-free clusters in linear time.

Each node gets a stage: stage(n) = max over producers p of stage(p) + (1 if p's support class
(supported / unsupported) differs from n's else 0). Clusters are the connected components of
supported nodes of equal stage. Any path leaving a cluster through an unsupported node comes
back at a strictly higher stage, so contracting clusters cannot create a cycle; the pass is one
topological sweep plus a union-find, O(nodes + edges).
"""
from __future__ import annotations

from dataclasses import dataclass

from torch.fx import Graph, Node

from .capability import STRUCTURAL, Capability


@dataclass
class Clustering:
    clusters: list[list[Node]]              # in topological order, each in topological order
    unsupported: dict[str, str]             # node name -> reason
    dropped: list[list[Node]]               # clusters below the minimum size


def _find(parent: dict, x):
    while parent[x] is not x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def cluster_graph(graph: Graph, capability: Capability, min_size: int = 1) -> Clustering:
    stage: dict[Node, int] = {}
    supported: dict[Node, bool] = {}
    unsupported: dict[str, str] = {}
    parent: dict[Node, Node] = {}
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr", "output", "call_module") or _graph_assertion(node):
            continue  # inputs, constants, export's input guards and runtime asserts stay in PyTorch
        reason = capability.why_not(node)
        supported[node] = reason is None
        if reason is not None:
            unsupported[node.name] = reason
        s = 0
        for p in node.all_input_nodes:
            if p in supported:
                s = max(s, stage[p] + (supported[p] != supported[node]))
        stage[node] = s
        if supported[node]:
            parent[node] = node
            for p in node.all_input_nodes:
                if supported.get(p) and stage[p] == s:
                    parent[_find(parent, p)] = _find(parent, node)
    groups: dict[Node, list[Node]] = {}
    for node in graph.nodes:  # graph order is topological, so each group is too
        if node in parent:
            groups.setdefault(_find(parent, node), []).append(node)
    kept, dropped = [], []
    for nodes in groups.values():
        compute = [n for n in nodes if _compute_op(n)]
        (kept if len(compute) >= min_size and compute else dropped).append(nodes)
    return Clustering(kept, unsupported, dropped)


def _graph_assertion(node: Node) -> bool:
    """A call nobody reads that returns nothing (aten._assert_tensor_metadata, ...)."""
    schema = getattr(node.target, "_schema", None)
    return not node.users and schema is not None and len(schema.returns) == 0


def _compute_op(node: Node) -> bool:
    from ..fx import schema_name
    return schema_name(node) not in STRUCTURAL
