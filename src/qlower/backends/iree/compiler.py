"""iree-compile through its Python API, with an in-memory cache of compiled modules.

The cache key is the MLIR text plus the flags: structurally identical clusters (the same model
compiled twice, a test's one-op graphs) compile once per process."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from .options import IreeOptions

_VMFB: dict[str, bytes] = {}


@dataclass
class CompiledVmfb:
    vmfb: bytes
    seconds: float      # iree-compile wall time (0 on a cache hit)
    cache: str          # "memory" | "miss"


def compile_mlir(asm: str, input_type: str, options: IreeOptions) -> CompiledVmfb:
    """Compile MLIR text (`input_type` "tosa" or "torch") to a VM flatbuffer for options' target."""
    import iree.compiler as ic
    flags = options.compile_flags()
    key = hashlib.sha256("\0".join([asm, input_type, options.target_backend, *flags]).encode()).hexdigest()
    if key in _VMFB:
        return CompiledVmfb(_VMFB[key], 0.0, "memory")
    start = time.perf_counter()
    vmfb = ic.compile_str(asm, target_backends=[options.target_backend], input_type=input_type,
                          extra_args=flags)
    _VMFB[key] = bytes(vmfb)
    return CompiledVmfb(_VMFB[key], time.perf_counter() - start, "miss")
