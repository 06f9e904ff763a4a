"""Clustering: group supported nodes into cycle-free clusters in linear time.

Each node gets a stage: stage(n) = max over producers p of stage(p) + (1 if p's support class
(supported / unsupported) differs from n's else 0). A cluster is ALL supported nodes of one
stage, connected or not: stages never decrease along a path and rise when it passes an
unsupported node, so a path between two nodes of stage s runs through supported nodes of stage s
only, and contracting a stage cannot create a cycle. Independent branches of one stage (the
heads of a multi-output model, parallel pools) are one engine call, not one each (measured: 48
pools on one input are 1 cluster, not 96 taking 55 s to compile). One topological sweep,
O(nodes + edges).
"""
from __future__ import annotations

from dataclasses import dataclass

from torch.fx import Graph, Node

from .capability import STRUCTURAL, Capability
from ..fx import mutation_hazards, schema_name


@dataclass
class Clustering:
    clusters: list[list[Node]]              # in topological order, each in topological order
    unsupported: dict[str, str]             # node name -> reason
    dropped: list[list[Node]]               # clusters below the minimum size


def cluster_graph(graph: Graph, capability: Capability, min_size: int = 1) -> Clustering:
    hazards = mutation_hazards(graph)   # in-place writes order their readers like data edges
    stage: dict[Node, int] = {}
    supported: dict[Node, bool] = {}
    unsupported: dict[str, str] = {}
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr", "output", "call_module") or _graph_assertion(node):
            continue  # inputs, constants, export's input guards and runtime asserts stay in PyTorch
        reason = hazards.pinned.get(node) or capability.why_not(node)
        supported[node] = reason is None
        if reason is not None:
            unsupported[node.name] = reason
        s = 0
        for p in (*node.all_input_nodes, *hazards.after.get(node, ())):
            if p in supported:
                s = max(s, stage[p] + (supported[p] != supported[node]))
        stage[node] = s
    groups: dict[int, list[Node]] = {}
    for node in graph.nodes:  # graph order is topological, so each group is too
        if supported.get(node):
            groups.setdefault(stage[node], []).append(node)
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
    return schema_name(node) not in STRUCTURAL
