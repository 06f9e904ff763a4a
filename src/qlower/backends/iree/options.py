"""Options of the IREE backend (one frozen dataclass, part of the compiled-module cache key)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IreeOptions:
    """How clusters are compiled and run.

    target_cpu "host": IREE detects this machine's CPU features (AVX2, AVX-512 VNNI, ...); an
    explicit name (e.g. "znver4") cross-compiles. data_tiling is on because IREE 3.13 leaves it off
    by default and its int8 matmul/conv kernels are ~3x faster with it (issue 16 measured 256^3
    i8 matmul 0.99 -> 0.30 ms). im2col turns convs into one matmul each, which data tiling then
    packs; both flags are plain iree-compile options.

    conv_im2col: qlower writes each int8/uint8 conv with groups 1 (1x1 included; depthwise keeps
    tosa.depthwise_conv2d) as its own im2col (zero-point padding, strided slices + concat, one
    i8 x i8 -> i32 `linalg.matmul`) instead of `tosa.conv2d`, because IREE 3.13's im2col rewrite
    fails on integer convs and the direct conv is slow (docs/iree.md, "What limits IREE on the
    int8 CNN"). False emits `tosa.conv2d` (pure TOSA, what tests/test_tosa_reference.py runs).
    """
    target_backend: str = "llvm-cpu"
    target_cpu: str = "host"
    data_tiling: bool = True
    im2col_convs: bool = True
    conv_im2col: bool = True
    driver: str = "local-sync"            # local-task: IREE's thread pool (see docs/iree.md)
    min_cluster_size: int = 1
    extra_flags: tuple[str, ...] = ()

    def compile_flags(self) -> list[str]:
        """iree-compile command-line flags for these options."""
        flags = [f"--iree-llvmcpu-target-cpu={self.target_cpu}"] if self.target_backend == "llvm-cpu" else []
        if self.data_tiling:
            flags.append("--iree-opt-data-tiling")
        if self.im2col_convs:
            flags.append("--iree-global-opt-use-im2col-for-convs")
        return flags + list(self.extra_flags)
