"""`qlower bench`: zoo models x stacks, side by side in one process run.

Every stack gets its own copy of the inputs and the harness checks the inputs are unchanged after
each call (a peer once wrote into its caller's input). Timing: warm-up, then `rounds` rounds; in
each round every stack runs a block of `block` calls, stacks in alternating order, with a pause
between blocks so ONNX Runtime's spinning worker threads do not tax the next stack (DESIGN.md).
A stack that fails to build or run is recorded with its error, never fatal."""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from . import zoo
from .api import compile as qcompile
from .quantize import QuantConfig
from .report import cosine, max_abs, sqnr_db

STACKS = ("eager-fp32", "ort-fp32", "ort-int8-qdq", "qlower-onnxruntime", "qlower-onnxruntime-w7",
          "qlower-reference")


@dataclass
class StackResult:
    model: str
    stack: str
    ok: bool
    error: str | None = None
    median_ms: float | None = None
    spread_ms: float | None = None
    vs_eager: float | None = None
    sqnr_db: float | None = None
    cosine: float | None = None
    max_abs: float | None = None
    prepare_s: float | None = None
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
    return lambda *xs: torch.from_numpy(session.run(None, {n: x.numpy() for n, x in zip(names, xs)})[0])


def build_stack(stack: str, entry, model, inputs, calibration, workdir: str) -> Callable:
    if stack == "eager-fp32":
        return lambda *xs: model(*xs)
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
        name = _ort_session(pre).get_inputs()[0].name

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.it = iter([{name: b[0].numpy()} for b in calibration])

            def get_next(self):
                return next(self.it, None)
        quantize_static(pre, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        return _ort_runner(_ort_session(dst))
    if stack.startswith("qlower-"):
        backend = "onnxruntime" if "onnxruntime" in stack else "reference"
        cfg = QuantConfig(weight_bits=7 if stack.endswith("-w7") else 8)
        cm = qcompile(model, inputs, quantize=cfg, calibration=calibration, backend=backend)
        if cm.report().fallbacks:
            reasons = "; ".join(f"#{c.id}: {c.reason}" for c in cm.report().fallbacks)
            print(f"  note: {stack} on {entry.name} has fallbacks: {reasons}")
        return lambda *xs: cm(*xs)
    raise ValueError(f"unknown stack {stack!r}")


def run_bench(models: list[str], stacks: list[str], rounds: int = 5, block: int = 10, warmup: int = 3,
              batch: int = 1, pause_s: float = 0.25, log: Callable[[str], None] = print) -> list[StackResult]:
    results: list[StackResult] = []
    for name in models:
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
                log(f"[{name}] preparing {stack}")
                start = time.perf_counter()
                try:
                    fn = build_stack(stack, entry, model, inputs, calibration, workdir)
                    copies = tuple(t.clone() for t in test)
                    out = fn(*copies)
                    if not all(torch.equal(a, b) for a, b in zip(copies, test)):
                        raise RuntimeError("stack modified its input tensors")
                    runners[stack] = (fn, copies)
                    row[stack] = StackResult(name, stack, True, prepare_s=time.perf_counter() - start,
                                             sqnr_db=sqnr_db(reference, out), cosine=cosine(reference, out),
                                             max_abs=max_abs(reference, out))
                except Exception as exc:  # a peer failing is a result, not a crash
                    row[stack] = StackResult(name, stack, False, error=str(exc).splitlines()[0][:200])
            for fn, copies in runners.values():
                for _ in range(warmup):
                    fn(*copies)
            order = list(runners)
            for r in range(rounds):
                for stack in (order if r % 2 == 0 else order[::-1]):
                    fn, copies = runners[stack]
                    t0 = time.perf_counter()
                    for _ in range(block):
                        fn(*copies)
                    row[stack].samples.append((time.perf_counter() - t0) * 1e3 / block)
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


def write_outputs(results: list[StackResult], out: Path, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps({"command": command, "results": [asdict(r) for r in results]},
                                               indent=1))
    lines = [f"Command: `{command}`", "",
             "| model | stack | median ms | spread ms | speed-up vs eager | SQNR dB | cosine | prepare s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.ok and r.median_ms is not None:
            lines.append(f"| {r.model} | {r.stack} | {r.median_ms:.3f} | {r.spread_ms:.3f} | {r.vs_eager:.2f}x | "
                         f"{r.sqnr_db:.1f} | {r.cosine:.5f} | {r.prepare_s:.1f} |")
        else:
            lines.append(f"| {r.model} | {r.stack} | failed: {r.error} | | | | | |")
    (out / "bench.md").write_text("\n".join(lines) + "\n")
