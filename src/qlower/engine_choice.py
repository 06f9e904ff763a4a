"""Engine choice by measurement: what `compile(backend="auto")` does.

Every installed candidate engine (onnxruntime, openvino, iree: `AUTO_CANDIDATES`, restricted by
$QLOWER_AUTO_BACKENDS or `compile(auto_candidates=...)`) compiles the model; each is run on the
example inputs and compared with the reference backend on the same quantized program, then timed
(median of a bounded loop); the fastest correct one is kept. Outputs are compared bit for bit
when the program is quantized and computes nothing in float but dequantize and exact data
movement (the canonical numerics are then fully defined); otherwise (fp32 models, float ops such
as softmax/LayerNorm between integer ops) within a float tolerance. A candidate that fails to
compile or run, mismatches, or is not faster than the reference backend (fallback clusters can
make it so) is recorded and skipped; if none is left, the reference backend runs the model.
`CompileReport.engine_trials` / `engine_choice` say what was tried and why the winner won.

Cost is bounded: no measurement with fewer than two candidates; quantization runs once per
distinct backend quantization (onnxruntime snaps add scales and may use 7-bit weights, the others
share one program); a candidate whose backend compiles in two halves (the `start` hook: iree,
whose iree-compile is a subprocess) begins as soon as its program exists, so its native compile
runs beside the other candidates' work, and is joined last; the correct candidates are timed
together at the end, in turn, each for `timing_calls` calls or `timing_seconds`; and a
recompile of the same lowered graph (same constants, candidates, options, input shapes, CPU and
thread count) reuses the earlier decision from `EngineSelector`'s bounded in-memory cache instead
of measuring again.

The selector used by `compile` is one module-level `EngineSelector` (`default_selector()`); its
only mutable state is that cache, an `LRUCache` of `AutoSettings.cache_entries` decisions.
Its candidates come from qlower's settings ($QLOWER_AUTO_BACKENDS, core/settings.py) at each use.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

import torch
from torch.fx import GraphModule

from .capture import leave_running
from .errors import BackendError
from .fx import mutated_attributes, schema_name
from .core.types import EngineTrial
from .backends.base import Backend, Executable, compile_graph, start_compile
from .backends.registry import backend_names, make_backend, options_backend
from .core.cache import LRUCache
from .core.settings import Settings, settings
from .core.version import __version__
from .backends.reference import ReferenceBackend
from .core import cache
from .core.cpu import fingerprint
from .core.metrics import energy_ratio_db, sqnr_db
from .quantize import is_quantized

# Engines backend="auto" measures, in this order, which is also the preference order (which one
# wins a tie). iree comes second: it runs onnxruntime's program (no quantization of its own), and
# a compile of it abandoned at the time budget still fills its cache for the next compile (the
# openvino candidates each need a quantization of their own).
AUTO_CANDIDATES = ("onnxruntime", "iree", "openvino", "openvino-native")
# Engine-native candidates: a backend with the options of its engine-native numerics profile
# (the Q/DQ program on the engine's own int8 kernels). Not bit-exact with the canonical numerics:
# judged by their accuracy against the float model (`AutoSettings.accuracy_margin_db`), the
# deviation from the canonical reference shown in their trial. Candidates by default when a model
# is quantized with the "float" profile and no backend_options; naming the candidates
# (auto_candidates=, $QLOWER_AUTO_BACKENDS) without them asks for canonical numerics only.
NATIVE_CANDIDATES = {"openvino-native": ("openvino", {"numerics": "openvino"})}


def candidate_label(backend: Backend) -> str:
    """The name a candidate goes by in trials and decisions ("openvino-native" for OpenVINO with
    its engine-native options)."""
    return f"{backend.name}-native" if getattr(getattr(backend, "options", None), "native", False) else backend.name


def choice_note(chosen: Backend) -> str:
    """The compile report's line for auto's choice; choosing the reference backend is named as
    running the whole model in PyTorch."""
    if isinstance(chosen, ReferenceBackend):
        return ("backend 'auto' chose to run the whole model in PyTorch (the reference backend): "
                "no candidate engine was correct and faster, or none is installed")
    return f"backend 'auto' chose '{candidate_label(chosen)}'"


def is_native(backend: Backend) -> bool:
    return candidate_label(backend) != backend.name

# Ops whose float result every engine computes identically (data movement, selection, IEEE-exact
# single operations): a quantized program holding no other float op is compared bit for bit.
EXACT_FLOAT_OPS = frozenset({
    "qlower::dequantize", "qlower::token_scale", "qlower::quantize_per_token", "qlower::dequantize_per_token",
    "qlower::dequantize_per_token_acc", "qlower::quantize_dynamic", "qlower::dequantize_dynamic",
    "qlower::linear_dynamic", "aten::view", "aten::reshape", "aten::_unsafe_view", "aten::permute",
    "aten::transpose", "aten::t", "aten::flatten", "aten::squeeze", "aten::unsqueeze",
    "aten::expand", "aten::cat", "aten::stack", "aten::slice", "aten::select", "aten::split",
    "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::clone", "aten::contiguous",
    "aten::alias", "aten::detach", "aten::relu", "aten::max_pool2d", "aten::max_pool1d",
    "aten::neg", "aten::abs", "getitem",
    # canonical float islands (integer_layer_norm, integer_rms_norm, integer_softmax): integer
    # statistics and single IEEE operations, bit-exact on every engine that runs them (openvino
    # refuses them)
    "qlower::layer_norm_integer", "qlower::rms_norm_integer", "qlower::softmax_integer",
    # an fp32 table (tabulate_pointwise, a float-result region): a gather of stored entries
    "qlower::table",
})


@dataclass(frozen=True)
class AutoSettings:
    """How backend="auto" measures. `from_env` reads $QLOWER_AUTO_BACKENDS (comma-separated
    backend names: the candidates; one name means that engine without measuring)."""
    candidates: tuple[str, ...] = AUTO_CANDIDATES
    source: str = "default"          # where `candidates` came from (for messages)
    timing_calls: int = 15           # at most this many timed calls per engine ...
    timing_seconds: float = 0.3      # ... or until this much time has passed (at least one call)
    tie_margin: float = 0.05         # within 5% of the fastest: the earlier candidate wins (noise)
    rtol: float = 1e-4               # float outputs: |got - want| <= atol + rtol * max|want|
    atol: float = 1e-5
    cache_entries: int = 32          # decisions kept in memory
    # candidates running different quantized programs (a backend adapts the preset: static
    # activations, power-of-two scales): a program whose output SQNR vs the float model on the
    # example inputs is more than this below the best program's is not chosen for speed
    accuracy_margin_db: float = 0.5
    # a quantized program with float ops: an engine beyond the float tolerance of the reference
    # is still correct at the reference's SQNR vs float (`accuracy_margin_db`) with no element
    # further from the reference than this times the reference's largest error vs float
    # (`_within_quantization_error`)
    max_error_factor: float = 2.0
    # the user's time: once the first candidate is compiled (capture, quantization and its
    # compile took T seconds since compile() began), the whole selection ends by budget_factor x T
    # (at least min_budget_s); a later candidate that would end past it is skipped when its
    # estimated compile time (from this process's earlier compiles) does not fit, or abandoned
    # when its compile or check call is still running at the deadline (a compile begun in the
    # background: at the deadline less what the timing of the correct candidates will take)
    budget_factor: float = 2.0
    min_budget_s: float = 2.0
    # a candidate's check call may take at most this many times the reference backend's call
    # on the same program (at least check_floor_s): an engine that slow cannot win
    check_factor: float = 20.0
    check_floor_s: float = 2.0

    @classmethod
    def from_env(cls, environ=None) -> "AutoSettings":
        """From qlower's settings (core/settings.py), or from `environ` where given."""
        s = settings() if environ is None else Settings.from_env(environ)
        return cls() if s.auto_backends is None else cls(candidates=s.auto_backends, source=s.auto_backends_source)


@dataclass(frozen=True)
class ProgramKey:
    """Which quantized program a candidate needs. Equal keys: equal programs. A candidate whose
    backend adjusts no qparams (`adjust` None) runs the program of an earlier candidate with the
    same config and stages: any canonical program is exact on every engine, so one quantization
    serves both (`EngineSelector._resolve`)."""
    config: str                 # the quantization config (repr); "" when nothing is quantized here
    adjust: str | None          # the backend's qparam adjustment (observer hook), if any
    stages: tuple[str, ...]     # the pass pipeline


@dataclass
class Program:
    """A lowered program: built once per distinct backend quantization (by api.compile)."""
    key: tuple                 # equal keys: equal programs (quantization config, observer hook)
    label: str                 # how it was quantized, for the report ("" for float models)
    ep: Any                    # the (quantized) ExportedProgram
    gm: GraphModule            # after the pass pipeline
    ctx: Any                   # the PassContext (rewrites, refusals)
    notes: list[str] = field(default_factory=list)


@dataclass
class Selection:
    backend: Backend
    program: Program
    executable: Executable
    trials: list[EngineTrial]
    explanation: str
    cached: bool = False
    # a candidate's compile was abandoned while running: it may finish into the engine's cache,
    # so the decision is not remembered and the next compile measures again
    retry: bool = False


@dataclass
class _Oracle:
    program: Program
    executable: Executable
    state: "_State"
    outputs: Any
    trial: EngineTrial
    exact: bool           # compare bit for bit (else within the float tolerance)
    call_s: float = 0.0   # its call on the example inputs (bounds a candidate's check call)


@dataclass
class _Decision:
    winner: str
    trials: list[EngineTrial]
    explanation: str


class _Abandoned(Exception):
    """A candidate's compile or check call ran past its time bound."""


def _bounded(fn: Callable[[], Any], seconds: float | None, what: str):
    """fn() in a worker thread, waited for at most `seconds` (None: called here, unbounded). Past
    it, _Abandoned: the call is left to finish on its own (its result dropped; Python cannot stop
    a running engine call), so the caller's time stays bounded. The thread is not a daemon: a
    process that exits meanwhile waits for it (an engine killed inside native code at interpreter
    shutdown aborted the process: measured with an abandoned iree compile)."""
    if seconds is None:
        return fn()
    box: dict[str, Any] = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as exc:   # handed to the caller below
            box["error"] = exc
    worker = threading.Thread(target=run, name=f"qlower-auto-{what}", daemon=False)
    worker.start()
    worker.join(max(seconds, 0.0))
    if worker.is_alive():
        if what.endswith("-compile"):   # its passes trace: the next compile waits for it
            leave_running(worker)
        raise _Abandoned(f"still running after {max(seconds, 0.0):.1f} s")
    if "error" in box:
        raise box["error"]
    return box["result"]


class EngineSelector:
    """Chooses the engine for backend="auto"; remembers each decision (bounded LRU) so a
    recompile of the same graph does not measure again."""

    def __init__(self, settings: AutoSettings | None = None, persist: bool = False):
        self._settings = settings        # None: qlower's settings at each use
        self._decisions = LRUCache((settings or AutoSettings()).cache_entries)
        self.measured = 0      # selections that ran measurements (not served from the cache)
        # seconds per graph node of each backend's compiles in this process (the latest): the
        # cheap estimate that skips a compile which cannot end within the time budget
        self._compile_rate: dict[str, float] = {}
        # abandoned compiles still running (backend -> (start, graph nodes)): a lower bound on
        # the estimate until they end and record their rate
        self._inflight: dict[str, tuple[float, int]] = {}
        # persist: decisions are also written to qlower's disk cache ($QLOWER_CACHE_DIR, "off"
        # disables it), so a compile in a new process measures nothing it measured before
        self.persist = persist

    @property
    def settings(self) -> AutoSettings:
        return self._settings or AutoSettings.from_env()

    def clear(self) -> None:
        self._decisions.clear()

    # ---------------------------------------------------------------- candidates
    def candidate_names(self, names: Sequence[str] | None = None) -> tuple[str, ...]:
        """`names` (compile's auto_candidates=: names, or one comma-separated string like
        $QLOWER_AUTO_BACKENDS), else the settings' candidates; validated."""
        source = "auto_candidates" if names is not None else self.settings.source
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",") if n.strip()]
        names = tuple(dict.fromkeys(names)) if names is not None else self.settings.candidates
        if not names or not all(isinstance(n, str) for n in names):
            raise BackendError(f"{source}: expected a non-empty list of backend names, got {names!r}",
                               hint=f"e.g. ('onnxruntime', 'openvino'); known: {backend_names()}")
        unknown = [n for n in names if (n not in backend_names() and n not in NATIVE_CANDIDATES) or n == "auto"]
        if unknown:
            raise BackendError(f"{source} names unknown backend(s) {unknown}",
                               hint=f"use some of {[*backend_names(), *NATIVE_CANDIDATES]}")
        return names

    # ---------------------------------------------------------------- selection
    def select(self, backends: Sequence[Backend], program_key: Callable[[Backend], Any],
               build: Callable[[Backend], Program], example_inputs: tuple, profile: str,
               why_unmeasured: str | None = None, float_outputs: Callable[[], Any] | None = None,
               source_digest: Callable[[], str] | None = None, started: float | None = None,
               progress: Callable[[str], None] | None = None) -> Selection:
        """`backends`: the available candidates, in preference order (the reference backend
        among them is the fallback, never measured). `program_key(b)`: which quantized program
        b needs (cheap; a ProgramKey lets candidates share one); `build(b)`: build it (quantize,
        lower). `float_outputs()`: the float model's outputs on the example inputs, to compare
        the accuracy of different programs. `source_digest()`: what every program is built from
        (captured graph, weights, calibration); with it a remembered decision builds only the
        winner's program, without it the first candidate's program is built to key the decision.
        `started`: when compile() began (perf_counter), the start of the time budget;
        `progress(text)`: told each phase (compile's terminal display)."""
        plain_from = time.perf_counter()   # what a plain compile would do (capture, build, compile) starts
        reference = next((b for b in backends if b.name == "reference"), None) or ReferenceBackend()
        measured = [b for b in backends if b.name != "reference"]
        say = progress or (lambda text: None)
        if len(measured) < 2:
            chosen = measured[0] if measured else reference
            why = why_unmeasured or ("the only available candidate" if measured else
                                     "no candidate engine is available")
            program = build(chosen)
            say(f"compiling for {chosen.name}")
            return Selection(chosen, program, compile_graph(chosen, program.gm), [],
                             f"{chosen.name}: {why}; not measured")

        programs: dict[Any, Program] = {}
        resolve = functools.partial(self._resolve, program_key, measured)

        def program_for(b: Backend) -> Program:
            key, owner = resolve(b)
            if key not in programs:
                programs[key] = build(owner)
            return programs[key]
        program_for.built = lambda b: resolve(b)[0] in programs

        source = source_digest() if source_digest is not None else graph_digest(program_for(measured[0]).gm)
        key = self._key(source, measured, program_key, example_inputs, profile)
        decision, where = self._decisions.get(key), "in this process"
        if decision is None and self.persist:
            decision, where = _load_decision(key), "on this machine (qlower's disk cache)"
        if decision is not None:
            chosen = next((b for b in [*measured, reference] if candidate_label(b) == decision.winner), reference)
            program = program_for(chosen)
            try:
                say(f"compiling for {chosen.name} (decided earlier)")
                executable = compile_graph(chosen, program.gm)
                self._decisions[key] = decision
                return Selection(chosen, program, executable, [replace(t) for t in decision.trials],
                                 decision.explanation + f" (decided by an earlier measurement of this graph "
                                 f"{where}; not measured again)", cached=True)
            except Exception:   # the engine no longer compiles it: measure afresh
                self._decisions.pop(key, None)

        self.measured += 1
        distinct = len({resolve(b)[0] for b in measured})
        selection = self._measure(measured, reference, program_for, example_inputs, float_outputs, distinct,
                                  started if started is not None else plain_from, say, plain_from)
        if selection.retry:
            # not remembered: a later compile measures again (the abandoned compile may have
            # finished into the engine's cache meanwhile, and then fits the budget); candidates
            # skipped before they started are remembered as such
            return selection
        self._decisions[key] = _Decision(candidate_label(selection.backend), [replace(t) for t in selection.trials],
                                         selection.explanation)
        if self.persist:
            _store_decision(key, self._decisions[key])
        return selection

    def _estimate(self, backend: str, nodes: int) -> float:
        """Seconds `backend` is expected to take compiling a graph of `nodes` nodes: its latest
        compile in this process, scaled; at least as long as an abandoned one has been running."""
        estimate = self._compile_rate.get(backend, 0.0) * nodes
        running = self._inflight.get(backend)
        if running is not None:
            estimate = max(estimate, (time.perf_counter() - running[0]) / running[1] * nodes)
        return estimate

    @staticmethod
    def _resolve(program_key, candidates: Sequence[Backend], backend: Backend) -> tuple[Any, Backend]:
        """(the key of the program `backend` runs, the candidate that builds it): its own, or,
        for a backend that adjusts no qparams, the first candidate's program of the same config
        and stages (ProgramKey)."""
        key = program_key(backend)
        if isinstance(key, ProgramKey) and key.adjust is None:
            for other in candidates:
                theirs = program_key(other)
                if isinstance(theirs, ProgramKey) and (theirs.config, theirs.stages) == (key.config, key.stages):
                    return theirs, other
        return key, backend

    def _measure(self, candidates: list[Backend], reference: Backend, program_for, example_inputs,
                 float_outputs=None, distinct: int = 1, started: float | None = None,
                 say: Callable[[str], None] = lambda text: None, plain_from: float | None = None) -> Selection:
        """Every candidate compiled, checked and timed, within the time budget: `started` is when
        compile() began, `plain_from` when the work a plain single-engine compile also does began
        (what came between, like loading the engines' modules, is auto's own cost); the budget is
        budget_factor x that plain work, counted from `started`.

        A candidate whose backend has a `start` hook (iree: iree-compile is a subprocess) starts
        its compile as soon as its program is built, before the candidates ahead of it compile:
        its interpreter-bound half then, its native compile in the background while the others
        compile and are checked; it is joined after them, bounded by the budget less the time
        the timing will take. The correct candidates are timed together at the end (`_time_together`)."""
        s = self.settings
        trials: list[EngineTrial] = []
        oracles: dict[int, _Oracle] = {}      # id(program) -> the reference backend on it
        results: dict[str, tuple[Executable, Program, EngineTrial]] = {}
        states: dict[str, _State] = {}
        call_s: dict[str, float] = {}         # each correct candidate's check call (the timing's cost)
        want = functools.cache(float_outputs or (lambda: None))   # the float model's outputs, once
        started = time.perf_counter() if started is None else started
        plain_from = started if plain_from is None else plain_from
        clock = {"deadline": None, "overhead": 0.0}   # deadline: set once the first candidate is compiled;
        # overhead: before then, time a plain compile does not spend (the reference's call, other
        # engines' halves begun in this thread)
        build_s: float | None = None   # the first program's build (quantization and passes)
        retry = False     # a compile abandoned while running (see Selection.retry)
        launched: dict[str, tuple[Any, float, int]] = {}   # label -> (Compiling or its error, start, nodes)
        joins: list[tuple[Backend, EngineTrial, Program, _Oracle]] = []   # launched: joined after the others

        def left() -> float | None:
            return None if clock["deadline"] is None else clock["deadline"] - time.perf_counter()

        def compiled_first() -> None:
            """The first candidate's capture, build and compile (a plain compile) ended: the deadline."""
            if clock["deadline"] is None:
                plain = time.perf_counter() - plain_from - clock["overhead"]
                clock["deadline"] = started + max(s.min_budget_s, s.budget_factor * plain)

        def launch(backend: Backend) -> None:
            """Start `backend`'s compile (its interpreter-bound half here, its native compile in the
            background), unless its estimated compile time is known not to fit."""
            name = candidate_label(backend)
            program = program_for(backend)
            nodes = max(1, len(program.gm.graph.nodes))
            remaining = left()
            if remaining is not None and self._estimate(name, nodes) > remaining:
                return   # skipped, with the reason, when the loop reaches it
            say(f"starting {name}'s compile")
            t0 = time.perf_counter()
            try:
                handle = start_compile(backend, program.gm)
            except Exception as exc:   # reported when the loop reaches it
                handle = exc
            launched[name] = (handle, t0, nodes)
            if clock["deadline"] is None:
                clock["overhead"] += time.perf_counter() - t0
            if not isinstance(handle, Exception):
                def record(h=handle, label=name, n=nodes, since=t0):
                    h.wait()
                    self._compile_rate[label] = (time.perf_counter() - since) / n
                    self._inflight.pop(label, None)
                threading.Thread(target=record, name=f"qlower-auto-{name}-rate", daemon=True).start()

        def check(backend: Backend, trial: EngineTrial, program: Program, oracle: _Oracle,
                  executable: Executable) -> None:
            """Run the compiled candidate once on the example inputs and judge it; a correct one
            joins `results` (timed later)."""
            name, native = trial.backend, is_native(backend)
            trial.fallbacks = sum(1 for c in executable.clusters if c.status == "fallback")
            try:
                state = _State(executable, program.gm)
                say(f"checking {name}")
                bound = max(s.check_floor_s, s.check_factor * oracle.call_s)
                t0 = time.perf_counter()
                got = _bounded(lambda st=state: st.call(example_inputs),
                               min(bound, max(left(), s.check_floor_s)), f"{name}-check")
                took = time.perf_counter() - t0
                state.restore()
                ok, trial.max_abs_diff, why = _compare(got, oracle.outputs, oracle.exact, s.rtol, s.atol)
                if native:   # its own arithmetic: judged against the float model, after all candidates
                    ok, trial.sqnr_db = want() is not None, sqnr_db(want(), got) if want() is not None else None
                    why = "no float model outputs to judge engine-native numerics against"
                    trial.check = (f"engine-native numerics: SQNR vs float {trial.sqnr_db:.1f} dB; max |diff| "
                                   f"{trial.max_abs_diff:.3g} from the reference on its Q/DQ program") if ok else None
                elif not ok and not oracle.exact and is_quantized_program(program) and want() is not None:
                    ok, detail = _within_quantization_error(got, oracle.outputs, want(), s)
                    trial.check = detail if ok else trial.check
                    why = why if ok else f"{why}; {detail}"
                if not ok:
                    trial.status, trial.reason = "mismatch", why
                    return
            except _Abandoned as exc:
                trial.status, trial.check = "abandoned", None
                trial.reason = (f"abandoned: its check call was {exc}, more than {s.check_factor:g}x the reference "
                                f"backend's call ({oracle.call_s * 1e3:.1f} ms) or past the time budget")
                return
            except Exception as exc:
                trial.reason = f"run raised {_brief(exc)}"
                return
            trial.status = "slower"   # until it wins
            results[name], states[name], call_s[name] = (executable, program, trial), state, took

        def timing_reserve() -> float:
            """What timing the correct candidates and the reference will take (one more candidate
            counted, as fast as the slowest so far), from their check calls."""
            calls = [*call_s.values(), max(call_s.values(), default=0.0),
                     *(o.call_s for o in oracles.values())]
            return sum(min(s.timing_seconds, (s.timing_calls + 1) * c) for c in calls)

        for index, backend in enumerate(candidates):
            name = candidate_label(backend)
            remaining = left()
            if remaining is not None and build_s is not None and not program_for.built(backend) and build_s > remaining:
                trials.append(EngineTrial(name, "abandoned", reason=(
                    f"not built: its program needs its own quantization, which took {build_s:.1f} s for the first "
                    f"candidate, past the time budget ({max(remaining, 0.0):.1f} s left of "
                    f"{clock['deadline'] - started:.1f} s)")))
                continue
            start = time.perf_counter()
            program = program_for(backend)
            build_s = time.perf_counter() - start if build_s is None else build_s
            if id(program) not in oracles:
                say(f"running the reference backend ({program.label or 'the program'})")
                t0 = time.perf_counter()
                oracles[id(program)] = self._oracle(reference, program, example_inputs, trials,
                                                    label=program.label if distinct > 1 else None)
                clock["overhead"] += time.perf_counter() - t0 if clock["deadline"] is None else 0.0
            oracle = oracles[id(program)]
            trial = EngineTrial(name, "failed", check="bit-exact" if oracle.exact else "float tolerance",
                                program=program.label if distinct > 1 else None)
            if is_native(backend):
                trial.check = "accuracy vs float (engine-native numerics)"
            trials.append(trial)
            # this and later candidates that compile in the background and whose program now
            # exists start now, so their native compile runs beside the work ahead of them
            for later in candidates[index:]:
                if candidate_label(later) not in launched and getattr(later, "start", None) is not None \
                        and program_for.built(later):
                    launch(later)
            if name in launched:
                joins.append((backend, trial, program, oracle))
                continue
            nodes = max(1, len(program.gm.graph.nodes))
            remaining = left()
            estimate = self._estimate(name, nodes)
            if remaining is not None and remaining <= 0:
                trial.status, trial.check = "abandoned", None
                trial.reason = f"not compiled: the time budget of {clock['deadline'] - started:.1f} s was spent"
                continue
            if remaining is not None and estimate > remaining:
                trial.status, trial.check = "abandoned", None
                trial.reason = (f"not compiled: its compile takes about {estimate:.1f} s here (measured on earlier "
                                f"compiles in this process, or one still running), past the time budget "
                                f"({max(remaining, 0.0):.1f} s left of {clock['deadline'] - started:.1f} s)")
                continue
            say(f"compiling for {name}")
            start = time.perf_counter()

            def compile_and_record(b=backend, gm=program.gm, n=nodes, t0=start, label=name):
                executable = compile_graph(b, gm)
                self._compile_rate[label] = (time.perf_counter() - t0) / n
                self._inflight.pop(label, None)
                return executable
            try:
                executable = _bounded(compile_and_record, remaining, f"{name}-compile")
            except _Abandoned as exc:
                self._inflight[name] = (start, nodes)
                retry = True
                trial.status, trial.check = "abandoned", None
                trial.reason = (f"abandoned: its compile was {exc}, at the end of the time budget of "
                                f"{clock['deadline'] - started:.1f} s (budget_factor x the time to the first "
                                "candidate's compile)")
                continue
            except Exception as exc:
                trial.check, trial.reason = None, f"compile raised {_brief(exc)}"
                continue
            finally:
                compiled_first()
            trial.compile_s = time.perf_counter() - start
            check(backend, trial, program, oracle, executable)

        for backend, trial, program, oracle in joins:
            name = trial.backend
            handle, start, nodes = launched[name]
            if isinstance(handle, Exception):
                trial.check, trial.reason = None, f"compile raised {_brief(handle)}"
                continue
            say(f"compiling for {name}")
            remaining = left()
            bound = None if remaining is None else remaining - timing_reserve()
            if not handle.wait(bound):
                self._inflight[name] = (start, nodes)
                retry = True
                trial.status, trial.check = "abandoned", None
                trial.reason = (f"abandoned: its compile (begun beside the others') was still running after "
                                f"{time.perf_counter() - start:.1f} s, at the end of the time budget of "
                                f"{clock['deadline'] - started:.1f} s (budget_factor x the time to the first "
                                "candidate's compile, less the timing's share)")
                continue
            try:
                executable = handle.finish()
            except Exception as exc:
                trial.check, trial.reason = None, f"compile raised {_brief(exc)}"
                continue
            finally:
                compiled_first()
            trial.compile_s = time.perf_counter() - start
            check(backend, trial, program, oracle, executable)

        if results:
            say("timing " + ", ".join(results))
            for name, (median, runs) in _time_together({n: states[n] for n in results}, example_inputs, s).items():
                results[name][2].median_ms, results[name][2].runs = median, runs

        # The reference's time, the baseline each correct candidate must beat: its check call was
        # the warm-up; the loop stops early once its fastest call is slower than every candidate
        # on that program (its median can then only be slower too).
        for oracle in oracles.values():
            mine = [t for _, prog, t in results.values() if prog is oracle.program]
            if mine and oracle.call_s * 1e3 > 10 * max(t.median_ms for t in mine):
                # its check call (cold) was over 10x slower than every candidate on the program: a
                # warm call would be timed once and found slower too, at the cost of one more
                # call, which on an interpreted program can take seconds; the cold call stands
                oracle.trial.median_ms, oracle.trial.runs = oracle.call_s * 1e3, 1
            elif mine:
                say("timing the reference backend")
                oracle.trial.median_ms, oracle.trial.runs = _time(
                    oracle.state, example_inputs, s, warmup=False, stop_above=max(t.median_ms for t in mine))
                for t in mine:
                    if t.median_ms >= oracle.trial.median_ms:
                        t.status = "not-faster"
                        t.reason = f"not faster than the reference backend ({oracle.trial.median_ms:.3f} ms)"
                        del results[t.backend]

        natives = {candidate_label(b) for b in candidates if is_native(b)}
        if (len(oracles) > 1 or natives & set(results)) and want() is not None:
            # after the reference's timing: only programs a kept candidate or the fallback runs
            # set the accuracy to match (refusing one for a program whose engines all lost to
            # the reference ran the whole model in PyTorch on the refused program itself)
            fallback = program_for(reference) if program_for.built(reference) else None
            self._refuse_less_accurate_programs(oracles, results, want(), natives, fallback)

        if not results:
            program = program_for(reference)
            if id(program) in oracles:
                executable = oracles[id(program)].executable
            else:
                executable = compile_graph(reference, program.gm)
            refused = ", ".join(f"{t.backend} {t.status}" for t in trials if t.status != "oracle")
            return Selection(reference, program, executable, trials,
                             f"reference: the whole model runs in PyTorch (qlower's reference backend): no "
                             f"candidate engine was correct and faster ({refused})", retry=retry)

        order = [candidate_label(b) for b in candidates]
        fastest = min(results.values(), key=lambda r: r[2].median_ms)[2]
        # noise guard: the earliest candidate within tie_margin of the fastest wins
        winner = next(n for n in order if n in results
                      and results[n][2].median_ms <= fastest.median_ms * (1 + s.tie_margin))
        executable, program, trial = results[winner]
        trial.status = "chosen"
        for name, (_, _, other) in results.items():
            if name != winner:
                other.reason = f"{other.median_ms / trial.median_ms:.2f}x the time of {winner}"
        correct = len(results)
        if trial is fastest:
            plural = "s" if correct > 1 else ""
            why = f"{winner}: fastest of {correct} correct candidate{plural} ({trial.median_ms:.3f} ms)"
        else:
            why = (f"{winner}: within {s.tie_margin:.0%} of the fastest ({fastest.backend} {fastest.median_ms:.3f} ms "
                   f"vs {trial.median_ms:.3f} ms) and earlier in the preference order {order}")
        refused = [t for t in trials if t.status in ("failed", "mismatch", "not-faster", "less-accurate", "abandoned")]
        if refused:
            why += "; refused: " + ", ".join(f"{t.backend} ({t.status})" for t in refused)
        return Selection(self._backend(candidates, winner), program, executable, trials, why, retry=retry)

    def _refuse_less_accurate_programs(self, oracles: dict, results: dict, want, natives=frozenset(),
                                       fallback: Program | None = None) -> None:
        """Candidates run different quantized programs: each program's output SQNR against the
        float model (its reference outputs, on the example inputs) goes into its trials, and a
        candidate whose program is more than `accuracy_margin_db` below the best that a kept
        candidate (`results`) or the fallback (the reference backend on `fallback`) runs is
        refused ("less-accurate"): a preset the user asked for is not traded for speed in silence."""
        for oracle in oracles.values():
            oracle.trial.sqnr_db = sqnr_db(want, oracle.outputs)
        running = {id(p) for _, p, _ in results.values()} | ({id(fallback)} if fallback is not None else set())
        considered = [o for o in oracles.values() if id(o.program) in running]
        native_programs = {id(p) for name, (_, p, _) in results.items() if name in natives}
        canonical = [o for o in considered if id(o.program) not in native_programs] or considered
        if not canonical:
            return
        best = max(canonical, key=lambda o: o.trial.sqnr_db)
        for name, (_, program, trial) in list(results.items()):
            if name not in natives:   # an engine-native candidate keeps its own measured SQNR
                trial.sqnr_db = oracles[id(program)].trial.sqnr_db
            if trial.sqnr_db < best.trial.sqnr_db - self.settings.accuracy_margin_db:
                trial.status = "less-accurate"
                trial.reason = (f"{'its outputs are' if name in natives else 'its program is'} "
                                f"{best.trial.sqnr_db - trial.sqnr_db:.1f} dB less accurate vs float than "
                                f"'{best.program.label}' on the example inputs")
                del results[name]

    def _oracle(self, reference: Backend, program: Program, example_inputs, trials, label) -> "_Oracle":
        """The reference backend on `program`: its outputs on the example inputs (the check) and
        whether candidates must match them bit for bit; it is timed later, if needed."""
        exact = is_quantized_program(program) and not float_compute_ops(program.gm)
        start = time.perf_counter()
        executable = compile_graph(reference, program.gm)
        trial = EngineTrial(reference.name, "oracle", compile_s=time.perf_counter() - start, program=label,
                            reason="candidates must match its outputs and be faster")
        state = _State(executable, program.gm)
        start = time.perf_counter()
        outputs = state.call(example_inputs)
        call_s = time.perf_counter() - start
        state.restore()
        trials.append(trial)
        return _Oracle(program, executable, state, outputs, trial, exact, call_s)

    @staticmethod
    def _backend(candidates, name):
        return next(b for b in candidates if candidate_label(b) == name)

    def _key(self, source: str, backends: Sequence[Backend], program_key, example_inputs, profile: str) -> str:
        """The decision's cache key: the digest of what the programs are built from, the
        candidates with their options and programs, input shapes/dtypes, profile, CPU and thread count."""
        h = hashlib.sha256(source.encode())
        for b in backends:
            h.update(f"|{b.name}:{getattr(b, 'options', None)!r}:{program_key(b)!r}".encode())
        leaves = torch.utils._pytree.tree_leaves(example_inputs)
        h.update(repr([(getattr(x, "dtype", type(x)), tuple(getattr(x, "shape", ()))) for x in leaves]).encode())
        h.update(f"|{profile}|{fingerprint()}|{torch.get_num_threads()}|{self.settings}|{_engine_versions()}".encode())
        return h.hexdigest()


# ---------------------------------------------------------------------------- disk
_DECISION_SUFFIX = ".auto.json"


@functools.lru_cache(maxsize=1)
def _engine_versions() -> str:
    """qlower's and the engines' versions: a decision measured with other versions is not reused."""
    from importlib import metadata
    out = [f"qlower {__version__}"]
    for dist in ("onnxruntime", "openvino", "iree-base-compiler", "iree-base-runtime"):
        try:
            out.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(out)


def _load_decision(key: str) -> "_Decision | None":
    """A decision stored by an earlier process (digest-checked like every cache entry; a corrupt
    or unreadable one is deleted and measured again)."""
    data, _ = cache.load_entry(key, _DECISION_SUFFIX)
    if data is None:
        return None
    try:
        raw = json.loads(data)
        return _Decision(str(raw["winner"]), [EngineTrial(**t) for t in raw["trials"]], str(raw["explanation"]))
    except (ValueError, KeyError, TypeError):
        return None


def _store_decision(key: str, decision: "_Decision") -> None:
    cache.store_entry(key, json.dumps({"winner": decision.winner, "explanation": decision.explanation,
                                       "trials": [asdict(t) for t in decision.trials]}).encode(), _DECISION_SUFFIX)


# ---------------------------------------------------------------------------- helpers
def is_quantized_program(program: Program) -> bool:
    return is_quantized(program.ep)


def float_compute_ops(gm: GraphModule) -> list[str]:
    """Ops computing a float result that engines may round differently (not in EXACT_FLOAT_OPS)."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        val = node.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        if not any(isinstance(v, torch.Tensor) and v.dtype.is_floating_point for v in vals):
            continue
        name = schema_name(node).split(".")[0]
        if name not in EXACT_FLOAT_OPS:
            out.append(name)
    return out


def graph_digest(gm: GraphModule) -> str:
    """sha256 of the graph's code and every tensor it reads through get_attr (dtype, shape, bytes)."""
    h = hashlib.sha256(gm.code.encode())
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        t = _resolve(gm, str(node.target))
        if isinstance(t, torch.Tensor):
            _update_with_tensor(h, str(node.target), t)
        else:
            h.update(f"{node.target}:{type(t).__name__}".encode())
    return h.hexdigest()


def source_digest(ep: torch.export.ExportedProgram, calibration=None) -> str:
    """sha256 of an exported program (graph code, every weight, buffer and constant, the ranges
    of its symbolic dims) and of the calibration inputs: what a quantized program is built from."""
    h = hashlib.sha256(ep.graph_module.code.encode())
    h.update(repr(sorted((str(k), str(v)) for k, v in ep.range_constraints.items())).encode())
    tensors = sorted({**ep.state_dict, **ep.constants}.items())
    tensors += [(f"calibration{i}", t) for i, t in enumerate(torch.utils._pytree.tree_leaves(calibration or []))]
    for name, t in tensors:
        if isinstance(t, torch.Tensor):
            _update_with_tensor(h, name, t)
        else:
            h.update(f"{name}:{type(t).__name__}:{t!r}".encode())
    return h.hexdigest()


def _update_with_tensor(h, name: str, t: torch.Tensor) -> None:
    t = t.detach().contiguous()
    h.update(f"{name}:{t.dtype}:{tuple(t.shape)}:".encode())
    h.update(hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"").digest())


def _resolve(module, path: str):
    obj = module
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


class _State:
    """Calls an executable for measuring without leaving a trace: inputs are cloned per call (a
    model may write its inputs), and module state the program writes (caches, counters) is put
    back before every call and at the end, so the kept executable starts where a fresh compile
    would."""

    def __init__(self, executable: Executable, gm: GraphModule):
        self.executable = executable
        self.saved: dict[str, torch.Tensor] = {}
        names = mutated_attributes(gm)
        if not names:
            return
        module = executable.module
        for name in sorted(names):
            t = _resolve(module, name) if module is not None else None
            if not isinstance(t, torch.Tensor):
                raise BackendError(f"module state {name!r} is not reachable on the compiled module, so "
                                   "measuring would change it")
            self.saved[name] = t.detach().clone()

    def restore(self) -> None:
        if not self.saved:
            return
        with torch.no_grad():
            for name, value in self.saved.items():
                _resolve(self.executable.module, name).copy_(value)

    def _prepared(self, example_inputs: tuple):
        """(the call's arguments, its grad mode): the state restored, the inputs cloned."""
        self.restore()
        args = torch.utils._pytree.tree_map(
            lambda x: x.clone() if isinstance(x, torch.Tensor) else x, example_inputs)
        return args, torch.no_grad() if self.executable.needs_no_grad else contextlib.nullcontext()

    def call(self, example_inputs: tuple):
        args, mode = self._prepared(example_inputs)
        with mode:
            return self.executable.run(*args)

    def timed_call(self, example_inputs: tuple) -> float:
        """Seconds of one call, the state restore and input copies outside the clock."""
        args, mode = self._prepared(example_inputs)
        with mode:
            t0 = time.perf_counter()
            self.executable.run(*args)
            return time.perf_counter() - t0


def _time(state: _State, example_inputs: tuple, s: AutoSettings, warmup: bool = True,
          stop_above: float | None = None) -> tuple[float, int]:
    """(median ms, timed calls): a warm-up call, then timed calls until `timing_calls` or
    `timing_seconds` (whichever first, at least one), or until the fastest call so far is slower
    than `stop_above` ms."""
    if warmup:
        state.call(example_inputs)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < s.timing_calls:
        times.append(state.timed_call(example_inputs))
        if time.perf_counter() - start >= s.timing_seconds or \
                (stop_above is not None and min(times) * 1e3 > stop_above):
            break
    state.restore()
    return statistics.median(times) * 1e3, len(times)


def _time_together(states: dict[str, _State], example_inputs: tuple, s: AutoSettings) -> dict[str, tuple[float, int]]:
    """{name: (median ms, timed calls)}: a warm-up call each, then rounds in which each is called
    once, in turn, until `timing_calls` rounds or `timing_seconds` per candidate in all (at least
    one round): what else runs on the machine meanwhile (other processes, a compile left running
    in the background) falls on every candidate alike."""
    for state in states.values():
        state.call(example_inputs)
    times: dict[str, list[float]] = {name: [] for name in states}
    start = time.perf_counter()
    for _ in range(s.timing_calls):
        for name, state in states.items():
            times[name].append(state.timed_call(example_inputs))
        if time.perf_counter() - start >= s.timing_seconds * len(states):
            break
    for state in states.values():
        state.restore()
    return {name: (statistics.median(t) * 1e3, len(t)) for name, t in times.items()}


def _compare(got, want, exact: bool, rtol: float, atol: float) -> tuple[bool, float | None, str | None]:
    """(equal enough, worst |got - want|, why not). exact: every element equal (NaN equals NaN);
    else float elements within atol + rtol * max|want| of the tensor; integers always exact."""
    g_leaves, g_spec = torch.utils._pytree.tree_flatten(got)
    w_leaves, w_spec = torch.utils._pytree.tree_flatten(want)
    if g_spec != w_spec:
        return False, None, f"output structure differs: {g_spec} vs {w_spec}"
    worst = 0.0
    for i, (g, w) in enumerate(zip(g_leaves, w_leaves)):
        if not isinstance(w, torch.Tensor) or not isinstance(g, torch.Tensor):
            if g != w:
                return False, None, f"output {i}: {g!r} != {w!r}"
            continue
        if g.dtype != w.dtype or g.shape != w.shape:
            return False, None, f"output {i}: {g.dtype}{list(g.shape)} vs reference {w.dtype}{list(w.shape)}"
        if g.numel() == 0:
            continue
        g64, w64 = g.detach().to(torch.float64), w.detach().to(torch.float64)
        same = (g64 == w64) | (torch.isnan(g64) & torch.isnan(w64))
        diff = torch.where(same, torch.zeros_like(g64), (g64 - w64).abs().nan_to_num(nan=float("inf")))
        worst = max(worst, float(diff.max()))
        if exact or not w.dtype.is_floating_point:
            bad = int((~same).sum())
            if bad:
                return False, worst, (f"output {i}: {bad}/{w.numel()} elements differ from the reference "
                                      f"(max {float(diff.max()):.3g}; bit-exact required)")
            continue
        finite = w64[torch.isfinite(w64)]
        bound = atol + rtol * (float(finite.abs().max()) if finite.numel() else 0.0)
        bad = int((diff > bound).sum())
        if bad:
            return False, worst, (f"output {i}: {bad}/{w.numel()} elements beyond the float tolerance "
                                  f"{bound:.3g} (max {float(diff.max()):.3g})")
    return True, worst, None


def _within_quantization_error(got, ref, want, s: AutoSettings) -> tuple[bool, str]:
    """(accepted, what was measured) for a quantized program with float ops between its integer
    ops (softmax, LayerNorm, GELU): an engine's fp32 kernels round those differently, a requantize
    after one flips a code now and then, and a deep model carries the flips to its outputs.
    Measured (int8, Intel Xeon): on a MiniLM-size encoder (6 layers, batch 8, L2-normalised
    output) onnxruntime / openvino were 4e-4 / 7e-4 from the reference, 616 / 345 of 3072
    elements beyond the float tolerance; on a BERT-base-size one (12 layers, 128 tokens) 97% of
    the elements were, the deviation as large as the program's own error vs float — at the same
    SQNR vs float to 0.01 dB: equally accurate, differently rounded; auto ran the reference
    interpreter (192 vs 15 ms on MiniLM). So such a candidate is correct when, per float output,
    its SQNR vs the float model (`want`) is within `accuracy_margin_db` of the reference's and no
    element is further from the reference than `max_error_factor` times the reference's largest
    error vs float; integer outputs and NaN/inf places stay exact."""
    tree_leaves = torch.utils._pytree.tree_leaves
    deviation_db, loss_db, worst_factor = math.inf, 0.0, 0.0
    for g, r, w in zip(tree_leaves(got), tree_leaves(ref), tree_leaves(want)):
        if not isinstance(r, torch.Tensor) or not r.dtype.is_floating_point:
            if not _compare(g, r, True, 0.0, 0.0)[0]:
                return False, "a non-float output differs"
            continue
        if not (isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor) and g.shape == r.shape == w.shape):
            return False, "no float output of the same shape to measure the quantization error against"
        g64, r64, w64 = (t.detach().double() for t in (g, r, w))
        finite, inf = torch.isfinite(r64), torch.isinf(r64)
        if not (torch.equal(finite, torch.isfinite(g64)) and torch.equal(torch.isnan(g64), torch.isnan(r64))
                and torch.equal(g64[inf], r64[inf])):
            return False, "NaN/inf in other places than the reference's"
        g64, r64, w64 = g64[finite], r64[finite], w64[finite]
        if not g64.numel():
            continue
        error = (r64 - w64).abs()
        deviation_db = min(deviation_db, energy_ratio_db(float(error.pow(2).sum()), float((g64 - r64).pow(2).sum())))
        loss_db = max(loss_db, sqnr_db(w64, r64) - sqnr_db(w64, g64))
        worst = float((g64 - r64).abs().max())
        worst_factor = max(worst_factor, worst / float(error.max()) if float(error.max()) > 0 else
                           (math.inf if worst > 0 else 0.0))
    ok = loss_db <= s.accuracy_margin_db and worst_factor <= s.max_error_factor
    return ok, (f"{'' if ok else 'not '}within the quantization error (SQNR vs float {loss_db:.2f} dB below the "
                f"reference's, at most {s.accuracy_margin_db:g}; largest deviation {worst_factor:.2f}x the reference's "
                f"largest error vs float, at most {s.max_error_factor:g}; deviation {deviation_db:.1f} dB below "
                f"the program's error)")


def _brief(exc: BaseException) -> str:
    first = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:200]}"


# The selector compile(backend="auto") uses. Its decision cache is the one piece of module-level
# mutable state here: an LRUCache bounded by AutoSettings.cache_entries, holding names and timings only
# (no engines, no tensors).
_DEFAULT = EngineSelector(persist=True)


def auto_backends(names, options=None, native: bool = True) -> tuple[list[Backend], str | None]:
    """(backends, why not measured) for compile(backend="auto"): the available ones among
    `names` (validated, in order) plus the reference backend (the oracle and fallback, last).
    `options` go to the backend they belong to; the others get their defaults. Engine-native
    candidates (NATIVE_CANDIDATES) are dropped where `native` is False (compile: a float model, a
    numerics profile other than "float") or where options were given (the user chose the
    engine's options). The second item says why there is nothing to measure (fewer than two
    engines), else None."""
    owner = options_backend(options)
    plain = [n for n in names if n not in NATIVE_CANDIDATES]
    if owner is not None and owner not in plain:
        raise BackendError(f"backend_options are for {owner!r}, which is not an auto candidate {list(names)}",
                           hint=f"compile with backend={owner!r}, or add it to the candidates")
    made = []
    for n in names:
        if n == "reference":
            continue
        if n in NATIVE_CANDIDATES:
            if not native or options is not None:
                continue
            base, fields = NATIVE_CANDIDATES[n]
            backend = make_backend(base)
            made.append(make_backend(base, replace(backend.options, **fields)))
        else:
            made.append(make_backend(n, options if n == owner else None))
    available = [b for b in made if b.available()]
    missing = list(dict.fromkeys(b.name for b in made if not b.available()))
    why = None
    if len(available) < 2:
        why = ("the only candidate" if available else "no candidate engine") + \
            (f" among {list(names)}" if tuple(names) != AUTO_CANDIDATES else " installed") + \
            (f" ({', '.join(missing)} not installed: pip install "
             f"'qlower[{','.join(n for n in missing if n != 'onnxruntime') or 'onnxruntime'}]')" if missing else "")
    return available + [make_backend("reference")], why


def default_selector() -> EngineSelector:
    return _DEFAULT
