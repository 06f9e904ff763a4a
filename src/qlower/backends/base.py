"""What a backend is: a name, whether it can run here, and compile(graph) -> executable."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Protocol

from torch.fx import GraphModule

from ..fx import schema_name
from ..partition import Capability  # noqa: F401  (used in the Backend protocol)
from ..report import ClusterInfo


@dataclass
class Executable:
    """A compiled graph: `run(*args)` has the model's calling convention; `module` is the
    (possibly restructured) GraphModule behind it, for inspection."""
    run: Callable
    clusters: list[ClusterInfo]
    module: GraphModule | None = None


class Backend(Protocol):
    name: str
    capability: "Capability"   # what it accepts (qlower ops / qlower schema)

    def available(self) -> bool: ...

    def compile(self, gm: GraphModule) -> Executable: ...


def op_counts(gm: GraphModule) -> dict[str, int]:
    """How many call_function nodes of each op schema the graph holds."""
    return dict(Counter(schema_name(n) for n in gm.graph.nodes if n.op == "call_function"))
