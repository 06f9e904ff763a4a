"""Options of the IREE backend (one frozen dataclass, part of the compiled-module cache key)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...errors import BackendError

# target_backend -> (iree-compile flag naming the GPU architecture, iree-runtime driver)
GPU_TARGETS = {
    "cuda": ("--iree-cuda-target", "cuda"),
    "rocm": ("--iree-rocm-target", "hip"),
    "vulkan-spirv": ("--iree-vulkan-target", "vulkan"),
}
CPU_TARGET = "llvm-cpu"

# A weight-only cluster's const-expr flags (IreeOptions.weight_only_dequantize): "load" hoists any
# constant expression whatever it adds to memory, "call" hoists none that grows (no cluster
# evaluates constant expressions at compile time: --iree-opt-const-eval=false in flags())
WEIGHT_ONLY_OP = "qlower::linear_weight_only"
_WEIGHT_ONLY_FLAGS = {
    "load": ("--iree-opt-const-expr-max-size-increase-threshold=4611686018427387904",),
    "call": ("--iree-opt-const-expr-max-size-increase-threshold=0",),
}


@dataclass(frozen=True)
class IreeOptions:
    """How clusters are compiled and run.

    target_cpu "host": IREE detects this machine's CPU features (AVX2, AVX-512 VNNI, ...); an
    explicit name (e.g. "znver4") cross-compiles. data_tiling is on because IREE 3.13 leaves it off
    by default and its int8 matmul/conv kernels are ~3x faster with it (measured: 256^3
    i8 matmul 0.99 -> 0.30 ms). im2col turns convs into one matmul each, which data tiling then
    packs; both flags are plain iree-compile options.

    data_tiling_path: which of IREE 3.13's two data-tiling implementations a cluster prefers:
    "dispatch" (`--iree-opt-data-tiling`, IREE's suggested one, from dispatch creation), "global"
    (`--iree-global-opt-data-tiling`, from global optimization) or "auto": "dispatch" for
    conv-dominated clusters and on GPUs, "global" for the rest. Measured (on an
    Intel Xeon, one thread, batch 8, static): int8 mobilenet 0.59 vs 0.89 ms and cnn 0.68 vs 0.71
    ms (dispatch faster), int8 transformer 0.32 vs 0.40 and vit 0.35 vs 0.44 ms (global faster);
    with batch and sequence dynamic the dispatch path fails to compile a masked mean pooling (a
    MiniLM-size sentence encoder then runs without data tiling: 59 ms int8, 53 ms fp32, at 8 x 40
    tokens; global path: 24 / 26 ms). Each path silently miscompiles programs the other computes
    exactly (data_tiling.py names them): a cluster with a hazard on its preferred path takes the
    other one, or none.

    conv_im2col: qlower writes each int8/uint8 conv with groups 1 (1x1 included; depthwise keeps
    tosa.depthwise_conv2d) as its own im2col (zero-point padding, strided slices + concat, one
    i8 x i8 -> i32 `linalg.matmul`) instead of `tosa.conv2d`, because IREE 3.13's im2col rewrite
    fails on integer convs and the direct conv is slow (docs/iree.md, "What limits IREE on the
    int8 CNN"). False emits `tosa.conv2d` (pure TOSA, what tests/test_tosa_reference.py runs).

    weight_only_dequantize: where a cluster with weight-only linears (`qlower.linear_weight_only`:
    i4/i8 codes in the module) dequantizes its weights. IREE 3.13's llvm-cpu does not fuse the
    dequantization into the matmul dispatch (it forms a dispatch of its own; measured on IREE's
    own `clone_dequantization` test pattern too), so the choice is IREE's const-expr hoisting:
    "load" hoists every dequantization into the module's initializer, run once when the module
    loads (compile-time evaluation is off for every cluster; with it, i8 codes were evaluated
    into fp32 constants: a vmfb as large as the float model's; i4 ones IREE does not evaluate) —
    the file holds codes, memory and call time are the float model's; "call" hoists nothing
    (threshold 0), so every call dequantizes: codes in memory too, and slower (measured in
    docs/iree.md, "Weight-only linears")
    """
    target_backend: str = "llvm-cpu"
    target_cpu: str = "host"
    data_tiling: bool = True
    data_tiling_path: str = "auto"        # "auto" | "dispatch" | "global" (above)
    im2col_convs: bool = True
    conv_im2col: bool = True
    driver: str = ""                      # "" = the target's; local-task: IREE's thread pool (docs/iree.md)
    target_gpu: str = ""
    ukernels: str = "auto"                # llvm-cpu microkernels: "auto" (per cluster) | "default" | "all" | "none"
    min_cluster_size: int = 1
    weight_only_dequantize: str = "load"  # "load" | "call": where weight-only clusters dequantize (below)
    extra_flags: tuple[str, ...] = ()

    def __post_init__(self):
        if self.target_backend != CPU_TARGET and self.target_backend not in GPU_TARGETS:
            raise BackendError(f"unknown IREE target backend {self.target_backend!r}",
                               hint=f"use one of {[CPU_TARGET, *GPU_TARGETS]}")
        if self.ukernels not in ("auto", "default", "all", "none", "mmt4d"):
            raise BackendError(f"unknown ukernels setting {self.ukernels!r}",
                               hint="use 'auto', 'default', 'all', 'none' or 'mmt4d'")
        if self.weight_only_dequantize not in _WEIGHT_ONLY_FLAGS:
            raise BackendError(f"unknown weight_only_dequantize {self.weight_only_dequantize!r}",
                               hint=f"use one of {list(_WEIGHT_ONLY_FLAGS)}")
        if self.data_tiling_path not in ("auto", "dispatch", "global"):
            raise BackendError(f"unknown data_tiling_path {self.data_tiling_path!r}",
                               hint="use 'auto', 'dispatch' or 'global'")
        if self.target_gpu and self.target_backend == CPU_TARGET:
            raise BackendError(f"target_gpu={self.target_gpu!r} needs a GPU target_backend",
                               hint=f"set target_backend to one of {list(GPU_TARGETS)}")

    @classmethod
    def for_target(cls, target: str, **kwargs) -> "IreeOptions":
        """Options for a target written "backend[:architecture]" (the CLI's --iree-target):
        "llvm-cpu", "cuda:sm_80", "rocm:gfx942", "vulkan-spirv:ampere"."""
        backend, _, arch = target.partition(":")
        if backend == CPU_TARGET:
            return cls(target_backend=backend, **({"target_cpu": arch} if arch else {}), **kwargs)
        return cls(target_backend=backend, target_gpu=arch, **kwargs)

    def resolved_for(self, ops: dict[str, int]) -> "IreeOptions":
        """These options for one cluster with these op counts: ukernels and data_tiling_path
        "auto" decided (conv-dominated clusters: all micro-kernels, dispatch-creation data tiling;
        the rest: IREE's default micro-kernels, global-optimization data tiling; on a GPU the
        dispatch-creation path, the only one measured there), and a weight-only cluster's
        const-expr flags (weight_only_dequantize) ahead of extra_flags."""
        convs = sum(n for op, n in ops.items() if "conv" in op)
        products = sum(n for op, n in ops.items() if any(k in op for k in ("linear", "matmul", "mm", "bmm")))
        conv_dominated = convs > products
        resolved = self
        if self.ukernels == "auto":
            resolved = dataclasses.replace(resolved,
                                           ukernels="all" if conv_dominated and not self.is_gpu else "default")
        if self.data_tiling_path == "auto":
            path = "dispatch" if conv_dominated or self.is_gpu else "global"
            resolved = dataclasses.replace(resolved, data_tiling_path=path)
        if ops.get(WEIGHT_ONLY_OP):
            resolved = dataclasses.replace(resolved, extra_flags=(*_WEIGHT_ONLY_FLAGS[self.weight_only_dequantize],
                                                                  *resolved.extra_flags))
        return resolved

    @property
    def is_gpu(self) -> bool:
        return self.target_backend in GPU_TARGETS

    def runtime_driver(self) -> str:
        """The iree-runtime driver that runs modules compiled with these options."""
        if self.driver:
            return self.driver
        return GPU_TARGETS[self.target_backend][1] if self.is_gpu else "local-sync"

    def compile_flags(self) -> list[str]:
        """iree-compile command-line flags for these options."""
        if self.is_gpu:
            flag = GPU_TARGETS[self.target_backend][0]
            flags = [f"{flag}={self.target_gpu}"] if self.target_gpu else []
        else:
            flags = [f"--iree-llvmcpu-target-cpu={self.target_cpu}"]
            if self.ukernels not in ("auto", "default"):
                flags.append(f"--iree-llvmcpu-enable-ukernels={self.ukernels}")
        if self.data_tiling:
            flags.append("--iree-global-opt-data-tiling" if self.data_tiling_path == "global"
                         else "--iree-opt-data-tiling")
        if self.im2col_convs:
            flags.append("--iree-global-opt-use-im2col-for-convs")
        # IREE demotes f64 to f32 by default: a float64 cluster compiled, then failed at its first
        # call (the module's buffers half the size the runner passed: "run failed", the cluster
        # in PyTorch); with the demotion off it computes float64 (measured: 4.4e-16 off eager)
        flags.append("--iree-input-demote-f64-to-f32=false")
        # constant expressions (data-tiled weight layouts) evaluated when the module is loaded
        # rather than by a JIT compile inside iree-compile: a third of iree-compile's time on the
        # int8 zoo transformers (JitGlobalsPass; measured on a loaded 2-vCPU Xeon: CPU 6.0 -> 4.4 s,
        # whole iree compile 18.7 -> 14.0 s, bert 17.4 -> 13.4 s), calls as fast and bit-identical
        flags.append("--iree-opt-const-eval=false")
        return flags + list(self.extra_flags)
