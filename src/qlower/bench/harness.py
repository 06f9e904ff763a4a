"""Timing: zoo models x stacks, side by side in one process run.

Every stack gets its own copy of the inputs and the harness checks the inputs are unchanged after
each call (a peer can write into its caller's input). Timing: warm-up, then `rounds` rounds; in
each round every stack runs a block of calls lasting about `block_ms` (at least `block` calls; the
count is fixed per stack from its warm-up time, so a 0.3 ms model is timed over ~130 calls per
sample, not 10, and one descheduling of this noisy VM does not decide a sample), stacks in
alternating order, with a pause between blocks so ONNX Runtime's spinning worker threads do not
tax the next stack (docs/performance.md).
A stack that fails to build or run, a peer library that is not installed, or a model that cannot
be built (optional weights) is recorded with its error, never fatal."""
from __future__ import annotations

import math
import re
import statistics
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .. import zoo
from .stacks import build_stack
from .. import report
from ..partition import Capability, cluster_graph
from .logcapture import LogCapture


@dataclass
class StackResult:
    model: str
    stack: str
    ok: bool
    batch: int = 1
    rss_mb: float | None = None          # resident memory added while preparing the stack
    peak_rss_mb: float | None = None     # the process's peak RSS after preparing (cumulative)
    error: str | None = None
    median_ms: float | None = None
    spread_ms: float | None = None
    vs_eager: float | None = None
    sqnr_db: float | None = None
    cosine: float | None = None
    max_abs: float | None = None
    prepare_s: float | None = None
    canonical_diff: int | None = None     # qlower stacks: output elements (N inputs) != the reference backend's
    canonical_max: float | None = None    # ... and the largest such difference
    gflop: float | None = None            # the model's fp32 FLOPs per call (eager, 2 per multiply-add)
    params_m: float | None = None         # the model's parameters, millions
    samples: list[float] = field(default_factory=list)


def _rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


_ANSI = re.compile(r"\x1b\[[0-9;]*m")   # torch.onnx colours its messages; bench.md is plain text


def _error(exc: BaseException) -> str:
    msg = (_ANSI.sub("", str(exc)).strip().splitlines() or [type(exc).__name__])[0][:200]
    hint = getattr(exc, "hint", None)
    return f"{type(exc).__name__}: {msg}" + (f" ({hint})" if hint else "")


def _canonical_diff(fn, entry, batch: int, log, inputs: int = 8) -> tuple[int, float] | tuple[None, None]:
    """Output elements (summed over `inputs` test inputs) where a qlower stack differs from the
    reference backend on the same quantized program, and the largest difference."""
    build = getattr(fn, "canonical", None)
    if build is None or inputs <= 0:
        return None, None
    diff, worst = 0, 0.0
    try:
        canonical = build()
        for seed in range(inputs):
            x = entry.inputs(batch, seed=4242 + seed)
            got = torch.utils._pytree.tree_leaves(fn(*x))
            want = torch.utils._pytree.tree_leaves(canonical(*x))
            diff += sum(int((a != b).sum()) for a, b in zip(got, want))
            worst = max([worst] + [float((a.float() - b.float()).abs().max()) for a, b in zip(got, want)])
    except Exception as exc:  # the stack itself ran; only its exactness stays unknown
        log(f"  note: reference backend failed, exactness not measured: {_error(exc)}")
        return None, None
    return diff, worst


def _flops(model, inputs) -> float | None:
    try:
        from torch.utils.flop_counter import FlopCounterMode
        with FlopCounterMode(display=False) as counter:
            model(*inputs)
        return counter.get_total_flops() / 1e9
    except Exception:   # counting is informative only
        return None


def run_bench(models: list[str], stacks: list[str], rounds: int = 5, block: int = 10, warmup: int = 3,
              batches: tuple[int, ...] = (1,), pause_s: float = 0.25, log: Callable[[str], None] = print,
              block_ms: float = 40.0, **kwargs) -> list[StackResult]:
    """Every model at every batch size (see run_plan for the keyword options)."""
    plan = [(name, b) for name in models for b in batches]
    return run_plan(plan, stacks, rounds=rounds, block=block, warmup=warmup, pause_s=pause_s, log=log,
                    block_ms=block_ms, **kwargs)


def run_plan(plan: list[tuple[str, int]], stacks: list[str], rounds: int = 5, block: int = 10, warmup: int = 3,
             pause_s: float = 0.25, log: Callable[[str], None] = print, block_ms: float = 40.0,
             log_file: Path | None = None, calibration_batches: int = 8, canonical_inputs: int = 8,
             on_pair: Callable[[list[StackResult]], None] | None = None) -> list[StackResult]:
    """(model, batch) pairs x stacks. `log` gets progress lines; what third-party code prints or
    warns meanwhile goes to `log_file` (bench.log) when given. `calibration_batches` batches
    calibrate the int8 stacks; `canonical_inputs` inputs check qlower stacks against the
    reference backend (0: not checked). `on_pair(results so far)` runs after each pair (the CLI
    rewrites its output files, so an interrupted long run keeps what it measured)."""
    torch.manual_seed(0)
    capture = LogCapture(log_file).open()
    results: list[StackResult] = []
    try:
        for name, batch in plan:
            results += _bench_model(name, batch, stacks, rounds, block, warmup, pause_s, log, block_ms,
                                    capture, calibration_batches, canonical_inputs)
            if on_pair is not None:
                on_pair(results)
    finally:
        capture.close()
    return results


def _bench_model(name, batch, stacks, rounds, block, warmup, pause_s, log, block_ms, capture,
                 calibration_batches, canonical_inputs) -> list[StackResult]:
    log(f"[{name} b{batch}] building the model")
    try:
        with capture():
            entry = zoo.get(name)
            model = entry.model_for(batch) if hasattr(entry, "model_for") else entry.model()
            inputs = entry.inputs(batch)
            calibration = entry.calibration(calibration_batches, batch)
            test = entry.inputs(batch, seed=4242)
            with torch.no_grad():
                reference = model(*test)
                gflop = _flops(model, test)
            params_m = sum(p.numel() for p in model.parameters()) / 1e6
    except Exception as exc:  # e.g. optional weights not installed: every stack gets the reason
        error = _error(exc)
        log(f"[{name} b{batch}] model unavailable: {error}")
        return [StackResult(name, stack, False, batch, error=error) for stack in stacks]
    runners: dict[str, Callable] = {}
    row: dict[str, StackResult] = {}
    with tempfile.TemporaryDirectory() as workdir, torch.no_grad():
        for stack in stacks:
            log(f"[{name} b{batch}] preparing {stack}")
            start, rss0 = time.perf_counter(), _rss_mb()
            try:
                with capture():
                    fn = build_stack(stack, entry, model, inputs, calibration, workdir)
                    copies = tuple(t.clone() for t in test)
                    out = fn(*copies)
                if not all(torch.equal(a, b) for a, b in zip(copies, test)):
                    raise RuntimeError("stack modified its input tensors")
                prepare_s, rss, peak = time.perf_counter() - start, _rss_mb() - rss0, _peak_rss_mb()
                if getattr(fn, "note", None):
                    log(f"  {fn.note[:240]}")
                    capture.note(fn.note)
                with capture():
                    diff, diff_max = _canonical_diff(fn, entry, batch, capture.note, canonical_inputs)
                row[stack] = StackResult(name, stack, True, batch, rss, peak, prepare_s=prepare_s,
                                         canonical_diff=diff, canonical_max=diff_max, gflop=gflop, params_m=params_m,
                                         sqnr_db=_metric("sqnr_db", reference, out),
                                         cosine=_metric("cosine", reference, out),
                                         max_abs=_metric("max_abs", reference, out))
                runners[stack] = (fn, copies)
            except Exception as exc:  # a peer failing is a result, not a crash
                row[stack] = StackResult(name, stack, False, batch, error=_error(exc), gflop=gflop, params_m=params_m)
                log(f"  {stack} failed: {row[stack].error}")
                capture.note(f"{name} b{batch} {stack} failed:\n{traceback.format_exc()}")
        if runners:
            log(f"[{name} b{batch}] timing {len(runners)} stacks, {rounds} rounds")
        with capture():
            _time(runners, row, test, rounds, block, warmup, pause_s, block_ms)
    for res in row.values():
        if res.samples:
            res.median_ms = statistics.median(res.samples)
            res.spread_ms = max(res.samples) - min(res.samples)
    eager = row.get("eager-fp32")
    for res in row.values():
        if res.median_ms and eager and eager.median_ms:
            res.vs_eager = eager.median_ms / res.median_ms
    return list(row.values())


def _metric(name: str, reference, out) -> float:
    return getattr(report, name)(reference, out)


def _time(runners, row, test, rounds, block, warmup, pause_s, block_ms) -> None:
    calls = {}
    for stack, (fn, copies) in runners.items():
        t0 = time.perf_counter()
        for _ in range(warmup):
            fn(*copies)
        per_call_ms = (time.perf_counter() - t0) * 1e3 / max(warmup, 1)
        calls[stack] = max(block, min(5000, math.ceil(block_ms / max(per_call_ms, 1e-3))))
    order = list(runners)
    for r in range(rounds):
        for stack in (order if r % 2 == 0 else order[::-1]):
            fn, copies = runners[stack]
            t0 = time.perf_counter()
            for _ in range(calls[stack]):
                fn(*copies)
            row[stack].samples.append((time.perf_counter() - t0) * 1e3 / calls[stack])
            if not all(torch.equal(a, b) for a, b in zip(copies, test)):
                row[stack].ok, row[stack].error = False, "stack modified its input tensors"
            time.sleep(pause_s)


def partition_scaling(nodes: int, every: int = 7) -> tuple[float, int]:
    """Seconds to cluster a synthetic chain-with-skips graph of `nodes` ops (every `every`-th op
    unsupported), and the number of clusters found. Near-linear clustering keeps this well under
    a second at 5,000 nodes."""
    from torch.fx import Graph

    aten = torch.ops.aten
    g = Graph()
    prev = skip = g.placeholder("x")
    for i in range(nodes):
        op = aten.sigmoid.default if i % every == every - 1 else aten.relu.default
        cur = g.call_function(op, (prev,))
        if i % 3 == 2:  # diamonds: a skip connection joins back in
            cur = g.call_function(aten.add.Tensor, (cur, skip))
            skip = cur
        prev = cur
    g.output(prev)
    cap = Capability("bench")
    cap.register(["aten::relu", "aten::add.Tensor"])
    start = time.perf_counter()
    clustering = cluster_graph(g, cap)
    return time.perf_counter() - start, len(clustering.clusters)
