"""What a backend is: a name, whether it can run here, its legalization passes and
compile(graph) -> executable. Every caller compiles through `compile_graph(backend, gm)`, which
runs the backend's `legalize_passes()` as ordinary passes (PassManager, verified after each)
on its own copy of the graph, then `backend.compile`."""
from __future__ import annotations

import contextlib
import operator
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from torch.fx import GraphModule, Node

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


class Compiling:
    """A compile in two halves, from a backend's `start(gm)` hook (its interpreter-bound work,
    clustering and emission, already done): `work()`, the engine's native compile (a subprocess,
    or native code that releases the GIL), and `complete()`, which makes the executable.
    `finish()` runs the native work in the calling thread, or, after `begin()`, waits for the
    background thread running it; then completes, in the calling thread.

    `work` must not trace or touch torch's global state (the dispatch mode stack, export's
    module hierarchy: capture.py's COMPILE_LOCK says why): the caller traces meanwhile, and an
    abandoned `work` runs on beside later compiles."""

    def __init__(self, work: Callable[[], Any], complete: Callable[[], Executable]):
        self._work, self._complete = work, complete
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.notes: list[str] = []   # report lines put before the executable's own (legalization's)

    def begin(self, nice: int = 0) -> None:
        """Run the native work in a background thread, `nice` steps below this process's priority
        (Linux, where niceness is per thread and what the thread starts inherits it: the work then
        takes the CPU the caller's own compile leaves, so running it alongside does not slow that
        compile). The thread is not a daemon: a process exiting meanwhile waits for it (an engine
        killed inside native code at interpreter shutdown aborted the process)."""
        def run():
            if nice and sys.platform.startswith("linux"):
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                                   min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))
            try:
                self._work()
            except BaseException as exc:   # raised again by finish(), in the caller's thread
                self._error = exc
        self._thread = threading.Thread(target=run, name="qlower-engine-compile", daemon=False)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """After `begin()`: wait for the native work at most `timeout` seconds (None: until it
        ends); whether it ended."""
        self._thread.join(None if timeout is None else max(timeout, 0.0))
        return not self._thread.is_alive()

    def finish(self) -> Executable:
        """The executable: the native work done (here, or waited for), its error raised, completed."""
        if self._thread is None:
            self._work()
        else:
            self.wait()
            if self._error is not None:
                raise self._error
        executable = self._complete()
        executable.notes[:0] = self.notes
        return executable


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
        pipeline on the backend's copy of the graph; default none;
      start(gm) -> Compiling: `compile(gm)` in two halves, so engines compile side by side
        (`start_compile`): what needs the interpreter now, the engine's native compile later,
        in the background or not (`Compiling`).
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


def start_compile(backend: Backend, gm: GraphModule, nice: int = 10) -> Compiling | None:
    """`compile_graph` begun, for a backend with a `start` hook (else None): the copy and its
    legalization, and the backend's own interpreter-bound work (clustering, emission), run now in
    this thread; the engine's native compile runs in the background (`Compiling.begin(nice)`)
    until `finish()`."""
    start = getattr(backend, "start", None)
    if start is None:
        return None
    cache.cache_dir()
    own = copy_graph_module(gm)
    notes = legalize(backend, own)
    compiling = start(own)
    compiling.notes[:0] = notes
    compiling.begin(nice)
    return compiling


def legalize(backend: Backend, gm: GraphModule) -> list[str]:
    """Run `backend.legalize_passes()` on gm in place; one report line per rewrite kind and
    per refusal."""
    passes = getattr(backend, "legalize_passes", lambda: [])()
    if not passes:
        return []
    ctx = PassManager(passes).run(gm, PassContext())
    return [f"{what} x{n}" for what, n in ctx.rewrites.items()] + [str(r) for r in ctx.refusals]


@dataclass
class WholeModel:
    """The one compiled cluster that computes a whole model, and how the model's flat inputs and
    outputs map onto it (an engine file exported from it takes the model's inputs and returns
    its outputs, in the model's order)."""
    cluster: object               # the cluster's module (OrtCluster, IreeCluster, ...)
    info: ClusterInfo
    args: list[int]               # the cluster's k-th runtime input is the model's input args[k]
    outputs: list[int]            # the model's i-th flat output is the cluster's output outputs[i]
    n_inputs: int                 # the model's flat inputs (one the cluster does not read stays an input)


def whole_model(executable: Executable, backend: str, artifact: str) -> WholeModel:
    """The cluster of `executable` that is the whole model, or a BackendError naming every node
    outside it (with the reason each runs in PyTorch) and any cluster that did not compile.
    Export's input guards (a `call_module` nobody reads) and a cluster reading the model's inputs
    in another order do not count: an engine file's inputs are named, not positional."""
    fused = executable.module
    if fused is None:
        raise BackendError(f"the model is not one {artifact}: the {backend} executable keeps no graph")
    nodes = list(fused.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    output = next(n for n in nodes if n.op == "output")
    calls = [n for n in nodes if n.op == "call_module" and str(n.target).startswith("cluster_")]
    compiled = [n for n in calls if getattr(getattr(fused, str(n.target)), "info", None) is not None
                and getattr(fused, str(n.target)).info.status == "compiled"]
    problems = [f"{_named(c)}: {c.reason}" for c in executable.clusters if c.status not in ("compiled", "constant")]
    call = compiled[0] if len(compiled) == 1 else None
    if call is None and not problems:
        problems.append(f"{len(compiled)} compiled {backend} clusters")
    reported = {name for c in executable.clusters if c.backend == "pytorch" for name in c.ops}
    for n in nodes:
        if n.op in ("placeholder", "output", "get_attr") or n is call or n.name in reported:
            continue
        if n.op == "call_module" and not n.users:   # torch.export's input guards (_guards_fn)
            continue
        if n.op == "call_function" and n.target is operator.getitem and n.args[0] is call:
            continue
        if n in calls:
            continue   # another cluster: counted above, or listed with the reason it did not compile
        problems.append(f"{n.name} ({_target(n)}) runs in PyTorch")
    args, outputs = [], []
    if call is not None:
        for a in call.args:
            if a in placeholders:
                args.append(placeholders.index(a))
            elif isinstance(a, Node):
                problems.append(f"the cluster reads {a.name} ({_target(a)}), which is computed outside it")
        results = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
        for r in results:
            if r is call:
                outputs.append(0)
            elif isinstance(r, Node) and r.op == "call_function" and r.target is operator.getitem \
                    and r.args[0] is call:
                outputs.append(r.args[1])
            else:
                what = f"{r.name} ({_target(r)})" if isinstance(r, Node) else f"the constant {str(r)[:40]}"
                problems.append(f"the model returns {what}, which the cluster does not compute")
    if problems:
        raise BackendError(f"the model is not one {artifact}; outside its {backend} cluster: " + "; ".join(problems),
                           hint="these nodes run in PyTorch between engine calls, which one engine file cannot hold; "
                                "export format 'pt2' keeps the whole program")
    cluster = getattr(fused, str(call.target))
    return WholeModel(cluster, cluster.info, args, outputs, len(placeholders))


def _named(info: ClusterInfo) -> str:
    """A reported cluster as the user reads it: a PyTorch node by its name, an engine cluster by
    its number."""
    return ", ".join(info.ops) if info.backend == "pytorch" else f"{info.backend} cluster #{info.id} ({info.status})"


def _target(node: Node) -> str:
    return schema_name(node) if node.op == "call_function" else str(node.target)


def op_counts(gm: GraphModule) -> dict[str, int]:
    """How many call_function nodes of each op schema the graph holds."""
    return dict(Counter(schema_name(n) for n in gm.graph.nodes if n.op == "call_function"))


def decompose_unsupported_block_ops(capability: "Capability"):
    """The legalization pass that decomposes the block ops `capability` does not accept."""
    return DecomposeBlockOps(capability.supports, why=f"{capability.backend} lacks it")
