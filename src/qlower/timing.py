"""Latency measurement shared by `qlower demo` and `qlower bench`."""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable, Iterator

import torch

from .errors import InputError

# a timing whose interquartile range is more than this fraction of its median is noisy: a ratio
# against it (a speed-up over eager) says more about the machine's load than about the model
NOISY_SPREAD = 0.25


@contextlib.contextmanager
def pinned_threads(threads: int | None) -> Iterator[int]:
    """Within: torch's intra-op thread count is `threads` (None: the current count), which eager
    PyTorch uses and the engines' thread options default to (OrtOptions / OvOptions threads=0);
    restored afterwards. Yields the count."""
    threads = torch.get_num_threads() if threads is None else threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InputError(f"threads must be a positive integer, got {threads!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


def median_latency_ms(fn: Callable[[], object], *, warmup: int = 2, runs: int = 10) -> tuple[float, float]:
    """(median, interquartile range) of `runs` timed calls in milliseconds after `warmup` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return _median_iqr(samples)


def paired_latency_ms(fns: dict[str, Callable[[], object]], *, warmup: int = 2,
                      runs: int = 10) -> dict[str, tuple[float, float]]:
    """{name: (median, interquartile range)} in milliseconds of `runs` calls of each function,
    the functions called in turn within each run (alternating order), so a slow phase of a busy
    machine falls on all of them rather than on whichever was timed then."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(runs):
        for name in (names if r % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            fns[name]()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: _median_iqr(s) for name, s in samples.items()}


def noisy(median_ms: float, spread_ms: float, limit: float = NOISY_SPREAD) -> bool:
    """Is a timing's spread more than `limit` of its median?"""
    return median_ms > 0 and spread_ms > limit * median_ms


def _median_iqr(samples: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return statistics.median(samples), q[2] - q[0]
