"""Mixed precision to an accuracy target: which layers stay float.

Given QuantConfig.target, quantize everything, measure the program's outputs against the float
model's on the calibration inputs, and if the target is missed, keep layers float in the order
of their measured sensitivity (each layer's own output SQNR on float inputs, report/verify.py,
worst first): the k worst for k = 1, 2, 4, ... until the target holds, then a bisection down to
the smallest k that holds (error is not monotone in k, so "smallest" is the bisection's). Each
trial is a full quantization (keep_float changes the annotation and hence the
calibrated ranges), so the cost is about 2 log2(layers) quantizations; every trial is recorded.
Precisions tried per layer: int8 and float (an int16-activation path exists on no backend
exactly yet, so it is not offered).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..core.metrics import cosine, sqnr_db
from ..errors import QuantizeError
from .config import AccuracyTarget, QuantConfig


@dataclass(frozen=True)
class Trial:
    float_layers: int
    measured: float


@dataclass
class PrecisionChoice:
    """What the search decided, for the compile report."""
    target: AccuracyTarget
    all_int8: float                          # the metric with every layer int8
    measured: float                          # ... with the chosen layers float
    float_layers: tuple[str, ...] = ()       # module paths kept float, most sensitive first
    trials: list[Trial] = field(default_factory=list)

    @property
    def met(self) -> bool:
        return self.target.met(self.measured)

    def __str__(self) -> str:
        unit = " dB" if self.target.metric == "sqnr" else ""
        head = (f"mixed precision (target {self.target}): all int8 {self.all_int8:.4g}{unit}; "
                f"{len(self.float_layers)} layer(s) float -> {self.measured:.4g}{unit}"
                f"{'' if self.met else ' (target NOT met)'}")
        tried = ", ".join(f"{t.float_layers} float: {t.measured:.4g}" for t in self.trials)
        names = f"; float: {', '.join(self.float_layers)}" if self.float_layers else ""
        return head + names + (f"; tried {tried}" if tried else "")


def measure(target: AccuracyTarget, model, program, inputs: list[tuple]) -> float:
    with torch.no_grad():
        want = [model(*x) for x in inputs]
        got = [program(*x) for x in inputs]
    return sqnr_db(want, got) if target.metric == "sqnr" else cosine(want, got)


# (model, example_inputs, calibration, config without a target) -> module paths of the quantized
# conv/linear/matmul layers, most sensitive first (report.verify.ranked_layers: each layer's own
# output SQNR with float inputs, so a bad layer's error carried into later layers does not make
# them look bad too). The caller passes it: that measurement sits above quantization.
RankLayers = Callable[[object, tuple, list, QuantConfig], "list[str]"]


def choose(model, example_inputs, calibration, config: QuantConfig,
           quantize_once: Callable[[QuantConfig], torch.export.ExportedProgram], ranked_layers: RankLayers,
           ) -> tuple[torch.export.ExportedProgram, PrecisionChoice]:
    """The program with the fewest float layers that meets config.target (or, when none does
    within max_float_layers, the most accurate one tried, with the choice saying so)."""
    target = config.target
    if isinstance(model, torch.export.ExportedProgram):
        raise QuantizeError("an accuracy target needs the float model, not an exported program",
                            hint="pass the nn.Module")
    base = dataclasses.replace(config, target=None)
    program = quantize_once(base)
    measured = measure(target, model, program.module(), calibration)
    choice = PrecisionChoice(target, measured, measured)
    if target.met(measured):
        return program, choice
    ranked = ranked_layers(model, example_inputs, calibration, base)
    limit = len(ranked) if target.max_float_layers is None else min(len(ranked), target.max_float_layers)
    results: dict[int, tuple[float, torch.export.ExportedProgram]] = {0: (measured, program)}

    def trial(k: int) -> float:
        if k not in results:
            kept = dataclasses.replace(base, keep_float=tuple(config.keep_float) + tuple(ranked[:k]))
            p = quantize_once(kept)
            results[k] = (measure(target, model, p.module(), calibration), p)
            choice.trials.append(Trial(k, results[k][0]))
        return results[k][0]

    k, low = 1, 0
    while k < limit and not target.met(trial(k)):
        low, k = k, min(2 * k, limit)
    if k >= limit and not target.met(trial(limit)):
        best = max(results, key=lambda i: results[i][0])
        choice.measured, choice.float_layers = results[best][0], tuple(ranked[:best])
        return results[best][1], choice
    high = k
    while high - low > 1:
        mid = (low + high) // 2
        if target.met(trial(mid)):
            high = mid
        else:
            low = mid
    choice.measured, choice.float_layers = results[high][0], tuple(ranked[:high])
    return results[high][1], choice
