"""`qlower demo`: quantize, compile and run the built-in models; one table row per model."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import zoo
from .api import compile as qcompile
from .core.metrics import cosine, sqnr_db
from .timing import median_latency_ms


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

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.qlower_ms if self.qlower_ms > 0 else float("nan")


def run_demo(models: list[str], backend: str = "auto", runs: int = 10, calibration_batches: int = 8) -> list[DemoRow]:
    rows = []
    torch.set_num_threads(max(1, torch.get_num_threads()))
    for name in models:
        entry = zoo.get(name)
        model = entry.model()
        inputs = entry.inputs(1)
        cm = qcompile(model, inputs, quantize="int8", calibration=entry.calibration(calibration_batches),
                      backend=backend)
        test = entry.inputs(1, seed=7)
        with torch.no_grad():
            reference = model(*test)
        out = cm(*test)
        eager_ms, _ = median_latency_ms(lambda: _no_grad(model, test), runs=runs)
        qlower_ms, _ = median_latency_ms(lambda: cm(*test), runs=runs)
        report = cm.report()
        lowered, total = report.lowered_fraction()
        rows.append(DemoRow(name, report.backend, len(report.clusters), len(report.fallbacks),
                            f"{lowered}/{total}", sqnr_db(reference, out), cosine(reference, out),
                            eager_ms, qlower_ms))
    return rows


def _no_grad(model, inputs):
    with torch.no_grad():
        return model(*inputs)
