"""iree-compile through its Python API, with a bounded in-memory cache of compiled modules and
qlower's disk cache behind it.

The cache key is the MLIR text plus the flags, the compiler's version and the CPU: structurally
identical clusters (the same model compiled twice, a test's one-op graphs) compile once per
process, and a compile in a new process reads the module from disk (`<key>.vmfb`, digest-checked
like every cache entry; measured: the zoo transformer's int8 recompile in a new process spent
~8 s of 11 in iree-compile before)."""
from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass

from ...core import cache
from .options import IreeOptions
from ...core.cpu import fingerprint

_VMFB = cache.LRUCache()   # bounded: QLOWER_MEMORY_CACHE_ENTRIES


@dataclass
class CompiledVmfb:
    vmfb: bytes
    seconds: float      # iree-compile wall time (0 on a cache hit)
    cache: str          # "memory" | "disk" | "miss"
    note: str | None = None
    command: str = ""   # the equivalent iree-compile command line (what `qlower export` documents)


def compile_command(input_type: str, options: IreeOptions, source: str = "model.mlir",
                    output: str = "model.vmfb") -> str:
    """The iree-compile command line that compiles MLIR text exactly as `compile_mlir` does
    (iree.compiler.compile_str runs the same tool with these flags)."""
    flags = [f"--iree-input-type={input_type}", f"--iree-hal-target-backends={options.target_backend}",
             *options.compile_flags()]
    return " ".join(["iree-compile", *flags, source, "-o", output])


def _compile(asm: str, input_type: str, options: IreeOptions) -> tuple[bytes, str]:
    import iree.compiler as ic
    from importlib import metadata

    flags = options.compile_flags()
    key = "iree-" + hashlib.sha256("\0".join([asm, input_type, options.target_backend, *flags,
                                              metadata.version("iree-base-compiler"),
                                              fingerprint()]).encode()).hexdigest()
    vmfb = _VMFB.get(key)
    if vmfb is not None:
        return vmfb, "memory"
    vmfb, _ = cache.load_entry(key, ".vmfb")
    if vmfb is not None:
        _VMFB[key] = vmfb
        return vmfb, "disk"
    vmfb = bytes(ic.compile_str(asm, target_backends=[options.target_backend], input_type=input_type,
                                extra_args=flags))
    _VMFB[key] = vmfb
    cache.store_entry(key, vmfb, ".vmfb")
    return vmfb, "miss"


def compile_mlir(asm: str, input_type: str, options: IreeOptions) -> CompiledVmfb:
    """Compile MLIR text (`input_type` "tosa" or "torch") to a VM flatbuffer for options' target.

    IREE 3.13's im2col rewrite fails to compile integer convs with batch > 1 ("'arith.addi' op
    requires the same type for all operands", conv_2d_nhwc_fhwc_q); such a module is compiled
    again without it, and the returned note says so."""
    start = time.perf_counter()
    try:
        vmfb, cache = _compile(asm, input_type, options)
        note = None
    except Exception as exc:
        if not options.im2col_convs:
            raise
        options = dataclasses.replace(options, im2col_convs=False)
        vmfb, cache = _compile(asm, input_type, options)
        note = f"compiled without im2col (with it: {str(exc).strip().splitlines()[-1][:120]})"
    seconds = time.perf_counter() - start if cache == "miss" else 0.0
    return CompiledVmfb(vmfb, seconds, cache, note, compile_command(input_type, options))
