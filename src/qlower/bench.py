"""`qlower bench`: zoo models x stacks, side by side in one process run.

Every stack gets its own copy of the inputs and the harness checks the inputs are unchanged after
each call (a peer once wrote into its caller's input). Timing: warm-up, then `rounds` rounds; in
each round every stack runs a block of calls lasting about `block_ms` (at least `block` calls; the
count is fixed per stack from its warm-up time, so a 0.3 ms model is timed over ~130 calls per
sample, not 10, and one descheduling of this noisy VM no longer decides a sample), stacks in
alternating order, with a pause between blocks so ONNX Runtime's spinning worker threads do not
tax the next stack (docs/performance.md).
A stack that fails to build or run is recorded with its error, never fatal."""
from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import zoo
from .api import compile as qcompile
from .quantize import QuantConfig
from .report import cosine, max_abs, sqnr_db

STACKS = ("eager-fp32", "compile-fp32", "pt2e-inductor-int8", "ort-fp32", "ort-int8-qdq", "ort-int8-dynamic",
          "qlower-onnxruntime", "qlower-onnxruntime-fp32", "qlower-onnxruntime-w8", "qlower-onnxruntime-qdq", "qlower-onnxruntime-qdq-unfused",
          "qlower-reference")
# The Q/DQ-form stacks answer "integer ops, or Q/DQ form and let the engine fuse?": the same
# quantized program without LowerQDQ, with ONNX Runtime's own QDQ fusions on (-qdq) or off
# (-qdq-unfused: float kernels between Q/DQ). Both are measured against the canonical numerics.
FORMULATIONS = ("qlower-onnxruntime", "qlower-onnxruntime-qdq", "qlower-onnxruntime-qdq-unfused")
DEFAULT_STACKS = ("eager-fp32", "compile-fp32", "pt2e-inductor-int8", "ort-fp32", "ort-int8-qdq",
                  "ort-int8-dynamic", "qlower-onnxruntime-fp32", "qlower-onnxruntime")
QUICK_STACKS = ("eager-fp32", "ort-fp32", "ort-int8-qdq", "qlower-onnxruntime-fp32", "qlower-onnxruntime")


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
    canonical_diff: int | None = None     # qlower stacks: output elements (8 inputs) != the reference backend's
    canonical_max: float | None = None    # ... and the largest such difference
    samples: list[float] = field(default_factory=list)


def _ort_session(path: str):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = torch.get_num_threads()
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _export_fp32_onnx(model, inputs, path: str) -> None:
    torch.onnx.export(model, inputs, path, dynamo=True, external_data=False, verbose=False)


def _ort_runner(session) -> Callable:
    names = [i.name for i in session.get_inputs()]

    def run(*xs):
        outs = [torch.from_numpy(o) for o in session.run(None, {n: x.numpy() for n, x in zip(names, xs)})]
        return outs[0] if len(outs) == 1 else tuple(outs)
    return run


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


def _pt2e_inductor(model, inputs, calibration):
    import torch._inductor.config as inductor_config
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(), quantizer)
    for batch in calibration:
        prepared(*batch)
    converted = convert_pt2e(prepared)
    inductor_config.freezing = True  # reaches the prepacked int8 kernels (measured: ~2x slower without)
    return torch.compile(converted)


def build_stack(stack: str, entry, model, inputs, calibration, workdir: str) -> Callable:
    if stack == "eager-fp32":
        return lambda *xs: model(*xs)
    if stack == "compile-fp32":
        return torch.compile(model)
    if stack == "pt2e-inductor-int8":
        return _pt2e_inductor(model, inputs, calibration)
    if stack == "ort-fp32":
        path = f"{workdir}/{entry.name}-fp32.onnx"
        _export_fp32_onnx(model, inputs, path)
        return _ort_runner(_ort_session(path))
    if stack == "ort-int8-qdq":
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
        from onnxruntime.quantization.shape_inference import quant_pre_process
        src, pre, dst = (f"{workdir}/{entry.name}-{s}.onnx" for s in ("fp32q", "pre", "int8"))
        _export_fp32_onnx(model, inputs, src)
        quant_pre_process(src, pre)
        names = [i.name for i in _ort_session(pre).get_inputs()]

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.it = iter([{n: t.numpy() for n, t in zip(names, b)} for b in calibration])

            def get_next(self):
                return next(self.it, None)
        quantize_static(pre, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        return _ort_runner(_ort_session(dst))
    if stack == "ort-int8-dynamic":
        from onnxruntime.quantization import QuantType, quantize_dynamic
        src, dst = f"{workdir}/{entry.name}-fp32d.onnx", f"{workdir}/{entry.name}-dyn.onnx"
        _export_fp32_onnx(model, inputs, src)
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=True)
        return _ort_runner(_ort_session(dst))
    if stack == "qlower-onnxruntime-fp32":   # the float model, lowered through torch.onnx by qlower
        cm = qcompile(model, inputs, backend="onnxruntime")
        return lambda *xs: cm(*xs)
    if stack.startswith("qlower-"):
        return _qlower_stack(stack, entry, model, inputs, calibration)
    raise ValueError(f"unknown stack {stack!r}; choose from {', '.join(STACKS)}")


def _qlower_stack(stack: str, entry, model, inputs, calibration) -> Callable:
    """A qlower stack, with `.canonical()`: builds the reference backend on the same quantized
    program (called after the stack's prepare time and memory are taken)."""
    from .api import quantize as qquantize
    from .backends.onnxruntime import OrtOptions
    from .passes import LowerQDQ, default_pipeline
    backend = "onnxruntime" if "onnxruntime" in stack else "reference"
    config = QuantConfig(weight_bits=8) if stack.endswith("-w8") else "int8"  # the preset picks per CPU
    ep = qquantize(model, inputs, calibration, config, backend=backend)
    passes, options = None, None
    if "-qdq" in stack:
        passes = [p for p in default_pipeline() if not isinstance(p, LowerQDQ)]
        options = OrtOptions(disabled_optimizers=()) if stack.endswith("-qdq") else OrtOptions()
    cm = qcompile(ep, inputs, backend=backend, passes=passes, backend_options=options)
    if cm.report().fallbacks:
        reasons = "; ".join(f"#{c.id}: {c.reason}" for c in cm.report().fallbacks)
        print(f"  note: {stack} on {entry.name} has fallbacks: {reasons}")

    def run(*xs):
        return cm(*xs)
    run.canonical = lambda: qcompile(ep, inputs, backend="reference")
    return run


def _canonical_diff(fn, entry, batch: int, log, inputs: int = 8) -> tuple[int, float] | tuple[None, None]:
    """Output elements (summed over `inputs` test inputs) where a qlower stack differs from the
    reference backend on the same quantized program, and the largest difference."""
    build = getattr(fn, "canonical", None)
    if build is None:
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
        log(f"  note: reference backend failed, exactness not measured: {type(exc).__name__}: {exc}")
        return None, None
    return diff, worst


def run_bench(models: list[str], stacks: list[str], rounds: int = 5, block: int = 10, warmup: int = 3,
              batches: tuple[int, ...] = (1,), pause_s: float = 0.25, log: Callable[[str], None] = print,
              block_ms: float = 40.0) -> list[StackResult]:
    torch.manual_seed(0)
    results: list[StackResult] = []
    for name in models:
        for batch in batches:
            results += _bench_model(name, batch, stacks, rounds, block, warmup, pause_s, log, block_ms)
    return results


def _bench_model(name, batch, stacks, rounds, block, warmup, pause_s, log, block_ms) -> list[StackResult]:
    results: list[StackResult] = []
    entry = zoo.get(name)
    model = entry.model()
    inputs = entry.inputs(batch)
    calibration = entry.calibration(8, batch)
    test = entry.inputs(batch, seed=4242)
    with torch.no_grad():
        reference = model(*test)
    runners: dict[str, Callable] = {}
    row: dict[str, StackResult] = {}
    with tempfile.TemporaryDirectory() as workdir, torch.no_grad():
        for stack in stacks:
            log(f"[{name} b{batch}] preparing {stack}")
            start, rss0 = time.perf_counter(), _rss_mb()
            try:
                fn = build_stack(stack, entry, model, inputs, calibration, workdir)
                copies = tuple(t.clone() for t in test)
                out = fn(*copies)
                if not all(torch.equal(a, b) for a, b in zip(copies, test)):
                    raise RuntimeError("stack modified its input tensors")
                prepare_s, rss, peak = time.perf_counter() - start, _rss_mb() - rss0, _peak_rss_mb()
                diff, diff_max = _canonical_diff(fn, entry, batch, log)
                row[stack] = StackResult(name, stack, True, batch, rss, peak, prepare_s=prepare_s,
                                         canonical_diff=diff, canonical_max=diff_max,
                                         sqnr_db=sqnr_db(reference, out), cosine=cosine(reference, out),
                                         max_abs=max_abs(reference, out))
                runners[stack] = (fn, copies)
            except Exception as exc:  # a peer failing is a result, not a crash
                msg = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
                row[stack] = StackResult(name, stack, False, batch, error=f"{type(exc).__name__}: {msg}")
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
    for res in row.values():
        if res.samples:
            res.median_ms = statistics.median(res.samples)
            res.spread_ms = max(res.samples) - min(res.samples)
    eager = row.get("eager-fp32")
    for res in row.values():
        if res.median_ms and eager and eager.median_ms:
            res.vs_eager = eager.median_ms / res.median_ms
    results += row.values()
    return results


def best_peer_ratios(results: list[StackResult]) -> dict[str, float]:
    """Per model/batch: best qlower latency / best non-qlower, non-eager peer latency (<1 is faster).
    Only qlower stacks that keep the canonical numerics count as qlower's."""
    out = {}
    for key in sorted({(r.model, r.batch) for r in results}):
        rows = [r for r in results if (r.model, r.batch) == key and r.ok and r.median_ms]
        ours = [r.median_ms for r in rows if r.stack.startswith("qlower-") and r.stack != "qlower-reference"
                and "-qdq" not in r.stack]  # the Q/DQ-form stacks do not keep the canonical numerics
        peers = [r.median_ms for r in rows if not r.stack.startswith("qlower-") and r.stack != "eager-fp32"]
        if ours and peers:
            out[f"{key[0]} b{key[1]}"] = min(ours) / min(peers)
    return out


def paired_ratios(results: list[StackResult]) -> dict[str, dict[str, float]]:
    """Per model/batch: qlower's best canonical stack against each non-eager peer, as the median
    over rounds of (qlower's block time / the peer's block time in the same round). Stacks of a
    round run back to back, so slow phases of a noisy machine hit both sides of each ratio;
    this is steadier than a ratio of medians (measured: one lstm run 1.62 as a ratio of medians,
    1.07 paired; reruns 0.85 / 0.98)."""
    out: dict[str, dict[str, float]] = {}
    for key in sorted({(r.model, r.batch) for r in results}):
        rows = [r for r in results if (r.model, r.batch) == key and r.ok and r.samples]
        ours = [r for r in rows if r.stack.startswith("qlower-") and r.stack != "qlower-reference"
                and "-qdq" not in r.stack]
        if not ours:
            continue
        best = min(ours, key=lambda r: r.median_ms)
        peers = {r.stack: statistics.median(a / b for a, b in zip(best.samples, r.samples))
                 for r in rows if not r.stack.startswith("qlower-") and r.stack != "eager-fp32"}
        if peers:
            out[f"{key[0]} b{key[1]}"] = peers
    return out


def write_outputs(results: list[StackResult], out: Path, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps({"command": command, "results": [asdict(r) for r in results],
                                                "qlower_vs_best_peer": best_peer_ratios(results),
                                                "qlower_vs_peers_paired": paired_ratios(results)}, indent=1))
    lines = [f"Command: `{command}`", "",
             "| model | batch | stack | median ms | spread ms | vs eager | SQNR dB | cosine | != canonical (max) "
             "| prepare s | RSS +MB | peak RSS MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.ok and r.median_ms is not None:
            ratio = f"{r.vs_eager:.2f}x" if r.vs_eager else "-"
            lines.append(f"| {r.model} | {r.batch} | {r.stack} | {r.median_ms:.3f} | {r.spread_ms:.3f} | "
                         f"{ratio} | {r.sqnr_db:.1f} | {r.cosine:.5f} | {canonical_cell(r)} | {r.prepare_s:.1f} | "
                         f"{r.rss_mb:.0f} | "
                         f"{r.peak_rss_mb:.0f} |")
        else:
            lines.append(f"| {r.model} | {r.batch} | {r.stack} | failed: {r.error} | | | | | | | | |")
    lines += ["", "qlower's best stack latency / best peer's (below 1: qlower faster):", ""]
    lines += [f"- {k}: {v:.2f}" for k, v in best_peer_ratios(results).items()]
    lines += ["", "Paired (median over rounds of qlower's block time / the peer's in the same round):", ""]
    lines += [f"- {k}: " + ", ".join(f"{peer} {v:.2f}" for peer, v in peers.items())
              for k, peers in paired_ratios(results).items()]
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    _chart(results, out / "bench.png")


def canonical_cell(r: StackResult) -> str:
    """'0' (bit-exact), '12 (3.1e-07)' (elements differing, largest difference), '-' for peers."""
    if r.canonical_diff is None:
        return "-"
    return "0" if r.canonical_diff == 0 else f"{r.canonical_diff} ({r.canonical_max:.1e})"


def _chart(results: list[StackResult], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted({(r.model, r.batch) for r in results})
    stacks = list(dict.fromkeys(r.stack for r in results))
    width = 0.8 / max(len(stacks), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups)), 4))
    for i, stack in enumerate(stacks):
        values = [next((r.vs_eager or 0.0 for r in results if (r.model, r.batch) == g and r.stack == stack), 0.0)
                  for g in groups]
        ax.bar([j + i * width for j in range(len(groups))], values, width, label=stack)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))])
    ax.set_xticklabels([f"{m} b{b}" for m, b in groups])
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_ylabel("speed-up vs eager fp32 (median)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def partition_scaling(nodes: int, every: int = 7) -> tuple[float, int]:
    """Seconds to cluster a synthetic chain-with-skips graph of `nodes` ops (every `every`-th op
    unsupported), and the number of clusters found. Near-linear clustering keeps this well under
    a second at 5,000 nodes."""
    from torch.fx import Graph
    from .partition import Capability, cluster_graph
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
