"""The reference backend: runs the integer graph in PyTorch with qlower's reference kernels,
i.e. exactly the canonical numerics. It supports every op, so the whole graph is one cluster.
It is the oracle every other backend is tested against, not a fast path."""
from __future__ import annotations

from torch.fx import GraphModule

from ..base import Executable, op_counts
from ...core.types import ClusterInfo
from ...partition import Capability


class ReferenceBackend:
    name = "reference"

    def __init__(self):
        self.capability = Capability(self.name)
        self.capability.register("*")  # every op: PyTorch runs whatever the graph holds

    def available(self) -> bool:
        return True

    def compile(self, gm: GraphModule) -> Executable:
        nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
        return Executable(run=gm, clusters=[ClusterInfo(0, self.name, nodes, op_counts(gm))], module=gm)
