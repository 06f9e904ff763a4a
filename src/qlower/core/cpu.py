"""CPU feature detection that decides which ONNX Runtime integer formulation is exact here."""
from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path


@functools.lru_cache(maxsize=1)
def has_vnni() -> bool:
    """True when the CPU has AVX-512 VNNI or AVX-VNNI: u8 x s8 dot products do not saturate."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """Machine architecture, CPU model and feature flags, hashed: emitted models depend on them
    (VNNI decides the weight formulation, kernel proofs run on this CPU), so the disk cache
    keys on it — a cache directory shared between machines never serves a foreign model."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    keep = sorted({ln for ln in lines if ln.startswith(("model name", "flags", "Features", "CPU part"))})
    return hashlib.sha256("\n".join([platform.machine(), *keep]).encode()).hexdigest()[:16]


def s8_weights_exact(w_min: int, w_max: int, int8_activations: bool = False) -> bool:
    """s8 weights are exact in ONNX Runtime's kernels: always against int8 activations (s8 x s8:
    measured exact in MatMulInteger, ConvInteger and QLinearConv on an AVX2-only AMD EPYC), and
    against uint8 activations when the CPU has VNNI or the weights fit in 7 bits ([-64, 63]):
    AVX2's vpmaddubsw saturates 16-bit pair sums otherwise (measured: ~90% of QLinearConv outputs
    wrong, up to 33 LSB, with full-range int8)."""
    return int8_activations or has_vnni() or (w_min >= -64 and w_max <= 63)
