"""What a backend is: a name, whether it can run here, and compile(graph) -> executable."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
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
    notes: list[str] = field(default_factory=list)   # backend decisions worth a line in the report
    # False when `run` never records autograd history itself (saves the no_grad context per call)
    needs_no_grad: bool = True
    # Graph inputs (placeholder names) whose finiteness the engine computes on every run, inside
    # its own kernels; `on_nonfinite(handler)` installs `handler(name, tensor)`, called when one
    # may hold NaN/inf. The CompiledModule's NaN policy then skips its own check of these inputs.
    engine_checked_inputs: frozenset[str] = frozenset()
    on_nonfinite: Callable[[Callable], None] | None = None


class Backend(Protocol):
    """Required: name, capability, available(), compile(gm). Optional hooks, found with getattr
    by `api.compile` (a backend without them gets the defaults):
      quant_config(config, preset) -> (config, note | None): adapt a named preset to the engine;
      adjust_observers(observed): change calibrated observers before conversion;
      pipeline(passes) -> passes: adapt the default pass pipeline (never a user's `passes=`)."""
    name: str
    capability: "Capability"   # what it accepts (qlower ops / qlower schema)

    def available(self) -> bool: ...

    def compile(self, gm: GraphModule) -> Executable: ...


def op_counts(gm: GraphModule) -> dict[str, int]:
    """How many call_function nodes of each op schema the graph holds."""
    return dict(Counter(schema_name(n) for n in gm.graph.nodes if n.op == "call_function"))


def decompose_unsupported_block_ops(gm: GraphModule, capability: "Capability") -> list[str]:
    """Run DecomposeBlockOps for this backend; report lines for what it did and refused."""
    from ..passes import PassContext, PassManager
    from ..passes.decompose_block_ops import DecomposeBlockOps
    ctx = PassManager([DecomposeBlockOps(capability.supports)]).run(gm, PassContext())
    return [f"{what} x{n} ({capability.backend} lacks it)" for what, n in ctx.rewrites.items()] + \
        [str(r) for r in ctx.refusals]
