"""Pieces every clustering backend shares: what replaces a cluster with no runtime inputs, and
the report lines for the nodes left in PyTorch."""
from __future__ import annotations

import torch
from torch.fx import GraphModule

from ..passes.functionalize_state import WRITE_BACK
from ..report import ClusterInfo


class ConstantCluster(torch.nn.Module):
    """A cluster whose inputs are all constants (e.g. arange -> unsqueeze): its value, computed
    once at compile time; no engine call at run time."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self):
        return self.value


def pytorch_infos(unsupported: dict[str, str], fused: GraphModule, start: int) -> list[ClusterInfo]:
    """One ClusterInfo per node the capability refused (name -> reason): "state" for the buffer
    write-backs of FunctionalizeState (PyTorch by design), "fallback" with the reason otherwise."""
    write_backs = {n.name for n in fused.graph.nodes if n.meta.get(WRITE_BACK)}
    infos = []
    for name, reason in unsupported.items():
        state = name in write_backs
        infos.append(ClusterInfo(start + len(infos), "pytorch", 1, {name: 1}, "state" if state else "fallback",
                                 "module state write-back" if state else reason))
    return infos
