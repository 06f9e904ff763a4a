"""Latency measurement shared by `qlower demo` and `qlower bench`."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def median_latency_ms(fn: Callable[[], object], *, warmup: int = 2, runs: int = 10) -> tuple[float, float]:
    """(median, interquartile range) of `runs` timed calls in milliseconds after `warmup` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    q = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return statistics.median(samples), q[2] - q[0]
