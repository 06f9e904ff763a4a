"""What a backend is: a name, whether it can run here, its legalization passes and
compile(graph) -> executable. Every caller compiles through `compile_graph(backend, gm)`, which
runs the backend's `legalize_passes()` as ordinary passes (PassManager, verified after each)
on its own copy of the graph, then `backend.compile`."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Protocol

from torch.fx import GraphModule

from ..fx import schema_name, copy_graph_module
from ..partition import Capability  # noqa: F401  (used in the Backend protocol)
from ..core import cache
from ..core.types import ClusterInfo
from ..errors import BackendError
from ..passes import PassContext, PassManager
from ..passes.decompose_block_ops import DecomposeBlockOps


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
    # `validating_run(args)` (one tuple): the common call done whole, where the engine's own
    # input validation equals the input specs' check (exactly the graph's input tensors, flat,
    # every dtype and static dim compared). Raises InputsRefused for anything else; the
    # CompiledModule then checks the inputs itself (naming the problem) and calls `run`.
    validating_run: Callable | None = None


class InputsRefused(Exception):
    """Raised by `Executable.validating_run` when the engine refused a call's inputs (or could
    not run them): the caller checks them and takes the general path."""


class Backend(Protocol):
    """Required: name, capability, available(), compile(gm). Optional hooks, found with getattr
    (a backend without them gets the defaults):
      quant_config(config, preset) -> (config, note | None): adapt a named preset to the engine;
      adjust_observers(observed): change calibrated observers before conversion;
      pipeline(passes) -> passes: adapt the default pass pipeline (never a user's `passes=`);
      legalize_passes() -> [Pass]: the backend's own rewrites (block ops it lacks decomposed,
        fused kernels proven exact, engine workarounds), run by `compile_graph` after the
        pipeline on the backend's copy of the graph; default none.
    `compile(gm)` receives the legalized graph and may restructure it (it is the backend's copy)."""
    name: str
    capability: "Capability"   # what it accepts (qlower ops / qlower schema)

    def available(self) -> bool: ...

    def compile(self, gm: GraphModule) -> Executable: ...


def compile_graph(backend: Backend, gm: GraphModule) -> Executable:
    """`backend`'s executable for `gm` (after the pass pipeline; left unchanged): a copy,
    legalized by the backend's passes, compiled. The legalization's rewrites and refusals lead
    the executable's report notes. An unsafe disk cache directory is refused here, before a
    cluster's compile could turn the refusal into a silent fallback (`cache.cache_dir`)."""
    cache.cache_dir()
    own = copy_graph_module(gm)
    notes = legalize(backend, own)
    executable = backend.compile(own)
    executable.notes[:0] = notes
    return executable


def legalize(backend: Backend, gm: GraphModule) -> list[str]:
    """Run `backend.legalize_passes()` on gm in place; one report line per rewrite kind and
    per refusal."""
    passes = getattr(backend, "legalize_passes", lambda: [])()
    if not passes:
        return []
    ctx = PassManager(passes).run(gm, PassContext())
    return [f"{what} x{n}" for what, n in ctx.rewrites.items()] + [str(r) for r in ctx.refusals]


def whole_model_cluster_info(cm, backend: str, artifact: str) -> ClusterInfo:
    """The one compiled cluster of `cm` when it is the whole model (the executable calls it
    directly, with the model's inputs and outputs), for exporting it as one `artifact` ("ONNX
    graph", "IREE module"); otherwise a BackendError naming what prevents it: another backend,
    nodes left in PyTorch (with their reasons), several clusters, PyTorch code around one."""
    report = cm.report()
    if report.backend != backend:
        raise BackendError(f"{artifact} export needs a model compiled for {backend}, not {report.backend!r}",
                           hint=f"compile with backend={backend!r}")
    blockers = [f"{next(iter(c.ops), '?')}: {c.reason}" for c in report.clusters if c.status != "compiled"]
    compiled = [c for c in report.clusters if c.status == "compiled"]
    whole = cm._executable.run is not cm._executable.module   # a direct runner: one cluster is the model
    if blockers or len(compiled) != 1 or not whole:
        detail = "; ".join(blockers) or (f"{len(compiled)} {backend} clusters" if len(compiled) != 1 else
                                         "the cluster's inputs/outputs are not the model's (PyTorch code around it)")
        raise BackendError(f"the model is not one {artifact}: {detail}",
                           hint=f"`qlower schema --backend {backend}` lists every node and why it is not supported")
    return compiled[0]


def op_counts(gm: GraphModule) -> dict[str, int]:
    """How many call_function nodes of each op schema the graph holds."""
    return dict(Counter(schema_name(n) for n in gm.graph.nodes if n.op == "call_function"))


def decompose_unsupported_block_ops(capability: "Capability"):
    """The legalization pass that decomposes the block ops `capability` does not accept."""
    return DecomposeBlockOps(capability.supports, why=f"{capability.backend} lacks it")
