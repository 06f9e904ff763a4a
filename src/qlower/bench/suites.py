"""Which models, batch sizes and stacks each `qlower bench --suite` runs, and how it times them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .llm import LLM_MODELS, LLM_STACKS, run_suite as run_llm_suite
from .stacks import DEFAULT_STACKS, QUICK_STACKS
from .. import zoo
from ..errors import QlowerError
from ..zoo.realsuite import REAL_SUITE

# the peers of the realistic suite: every engine's own fp32 and int8 pipeline, and qlower's int8
# on each backend (a backend that cannot compile a model is an error row)
REAL_STACKS = ("eager-fp32", "ort-fp32", "ort-int8-qdq", "ort-int8-dynamic", "openvino-fp32", "openvino-nncf-int8",
               "pt2e-inductor-int8", "qlower-onnxruntime", "qlower-openvino", "qlower-openvino-native", "qlower-iree")


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    plan: Callable[[], list[tuple[str, int]]]   # (zoo model, batch) in run order
    stacks: tuple[str, ...]
    rounds: int = 7
    block: int = 10                 # at least this many calls per timed block
    warmup: int = 3
    block_ms: float = 40.0          # ... and about this long
    calibration_batches: int = 8
    canonical_inputs: int = 8       # inputs compared with the reference backend (qlower stacks)
    runner: Callable | None = None  # a suite with its own run (bench/llm.py): called instead of the harness

    def models(self) -> list[str]:
        return list(dict.fromkeys(name for name, _ in self.plan()))

    def batches(self) -> tuple[int, ...]:
        return tuple(sorted({b for _, b in self.plan()}))


def _default_plan() -> list[tuple[str, int]]:
    return [(name, 1) for name in zoo.default_bench_models() if not name.startswith("hf-real-")]


def _real_plan() -> list[tuple[str, int]]:
    return [(name, b) for name, batches in REAL_SUITE for b in batches]


SUITES: dict[str, Suite] = {
    "default": Suite("default", "every small zoo model at batch 1 (not the wide or real-size ones)",
                     _default_plan, DEFAULT_STACKS),
    "quick": Suite("quick", "smoke run: cnn and transformer, fast stacks, 2 rounds (< 3 min)",
                   lambda: [("cnn", 1), ("transformer", 1)], QUICK_STACKS, rounds=2, block=3, warmup=1, block_ms=5.0),
    # realistic sizes take seconds per call at batch 8: one call per timed block of ~0.2 s, fewer
    # rounds, 4 calibration batches, exactness checked on 2 inputs
    "real": Suite("real", "MiniLM-size (seq 32, 128), BERT-base-size, ResNet-50, SmolLM2-135M prefill 128 and "
                          "decode step, batch 1 and 8, against every engine's own int8 pipeline",
                  _real_plan, REAL_STACKS, rounds=5, block=1, warmup=2, block_ms=200.0, calibration_batches=4,
                  canonical_inputs=2),
    "llm": Suite("llm", "greedy generation of SmolLM2-135M (prompt 128, 128 decode steps, batch 1 and 4) on qlower's "
                        "presets, llama.cpp, ONNX Runtime int4, OpenVINO + NNCF int4, torchao (bench/llm.py)",
                 lambda: [(m, b) for m in LLM_MODELS for b in (1, 4)], LLM_STACKS, rounds=3, runner=run_llm_suite),
}


def get(name: str) -> Suite:
    if name not in SUITES:
        raise QlowerError(f"unknown bench suite {name!r}", hint=f"choose from {', '.join(SUITES)}")
    return SUITES[name]
