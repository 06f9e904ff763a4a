"""`qlower demo`: quantize, compile and run the built-in models; one table row per model.

Eager PyTorch (the baseline) and the compiled model are timed on the same, stated number of
threads (`torch.set_num_threads`, which the engines' thread options default to), their calls
interleaved; a baseline whose spread is large is flagged (`DemoRow.warnings`) instead of turned
into a speed-up headline."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import zoo
from .api import compile as qcompile
from .core.metrics import cosine, sqnr_db
from .timing import NOISY_SPREAD, noisy, paired_latency_ms, pinned_threads


@dataclass
class DemoRow:
    model: str
    backend: str
    clusters: int
    fallbacks: int
    lowered: str
    sqnr_db: float
    cosine: float
    eager_ms: float
    qlower_ms: float
    threads: int = 1
    eager_spread_ms: float = 0.0      # interquartile ranges of the timed calls
    qlower_spread_ms: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.qlower_ms if self.qlower_ms > 0 else float("nan")


def run_demo(models: list[str], backend: str = "auto", runs: int = 10, calibration_batches: int = 8,
             threads: int | None = None) -> list[DemoRow]:
    """One row per zoo model. `threads`: the intra-op threads of eager PyTorch and of the
    engines alike (default: torch's current count), restored afterwards."""
    with pinned_threads(threads) as threads:
        return [_row(name, backend, runs, calibration_batches, threads) for name in models]


def _row(name: str, backend: str, runs: int, calibration_batches: int, threads: int) -> DemoRow:
    entry = zoo.get(name)
    model = entry.model()
    inputs = entry.inputs(1)
    cm = qcompile(model, inputs, quantize="int8", calibration=entry.calibration(calibration_batches),
                  backend=backend)
    test = entry.inputs(1, seed=7)
    with torch.no_grad():
        reference = model(*test)
    out = cm(*test)
    times = paired_latency_ms({"eager": lambda: _no_grad(model, test), "qlower": lambda: cm(*test)}, runs=runs)
    (eager_ms, eager_spread), (qlower_ms, qlower_spread) = times["eager"], times["qlower"]
    report = cm.report()
    lowered, total = report.lowered_fraction()
    warnings = []
    for who, median, spread in (("eager PyTorch", eager_ms, eager_spread), ("qlower", qlower_ms, qlower_spread)):
        if noisy(median, spread):
            warnings.append(f"{name}: {who}'s timing is noisy ({median:.3f} ms, interquartile range {spread:.3f} ms, "
                            f"over {NOISY_SPREAD:.0%} of the median): the speed-up is unreliable; rerun on an idle "
                            f"machine, with more --runs or fewer --threads")
    return DemoRow(name, report.backend, len(report.clusters), len(report.fallbacks), f"{lowered}/{total}",
                   sqnr_db(reference, out), cosine(reference, out), eager_ms, qlower_ms, threads,
                   eager_spread, qlower_spread, warnings)


def _no_grad(model, inputs):
    with torch.no_grad():
        return model(*inputs)
