"""What a bench ran on: CPU model, the ISA features that decide int8 kernels, threads, library
versions. Written into the header of bench.md, bench.json and the terminal table, so a number is
never read without its machine."""
from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

# /proc/cpuinfo flag -> the name printed. VNNI decides whether u8 x s8 dot products saturate
# (docs/numerics.md); AMX-INT8 is the tile unit of Sapphire Rapids and later.
ISA_FLAGS = {"avx2": "AVX2", "avx512f": "AVX-512F", "avx512_vnni": "AVX-512 VNNI", "avx_vnni": "AVX-VNNI",
             "amx_int8": "AMX-INT8"}
# distribution name -> the name printed (importlib.metadata: nothing is imported)
LIBRARIES = {"torch": "torch", "torchao": "torchao", "onnxruntime": "onnxruntime", "onnx": "onnx",
             "openvino": "openvino", "nncf": "nncf", "iree-base-compiler": "iree",
             "iree-base-runtime": "iree-runtime", "transformers": "transformers", "qlower": "qlower"}


def cpuinfo(text: str | None = None) -> dict:
    """CPU model name, clock (MHz, as the kernel reports it: a VM's nominal value), flags."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            text = ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break   # end of the first processor's block
            continue
        fields.setdefault(key.strip(), value.strip())
    mhz = fields.get("cpu MHz")
    # family/model: a hypervisor may shorten the name to "AMD EPYC"; family 25 model 17 is Genoa (Zen 4)
    cpuid = (f"family {fields['cpu family']} model {fields['model']}"
             if "cpu family" in fields and "model" in fields else None)
    return {"model": fields.get("model name") or platform.processor() or platform.machine(),
            "mhz": float(mhz) if mhz else None, "cpuid": cpuid,
            "flags": set(fields.get("flags", "").split())}


def isa_features(flags: set[str]) -> dict[str, bool]:
    return {name: flag in flags for flag, name in ISA_FLAGS.items()}


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist, name in LIBRARIES.items():
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine_info(cpuinfo_text: str | None = None) -> dict:
    """JSON-ready description of this machine and its software, for bench.json's `machine`."""
    import torch
    cpu = cpuinfo(cpuinfo_text)
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    return {"cpu": cpu["model"], "cpu_mhz": cpu["mhz"], "cpuid": cpu["cpuid"], "isa": isa_features(cpu["flags"]),
            "logical_cpus": os.cpu_count(), "usable_cpus": usable, "threads": torch.get_num_threads(),
            "python": platform.python_version(), "platform": platform.platform(terse=True),
            "versions": library_versions()}


def describe(info: dict) -> list[str]:
    """Two or three human lines for headers: CPU and ISA, threads, versions."""
    isa = ", ".join(f"{name} {'yes' if has else 'no'}" for name, has in info["isa"].items())
    mhz = f" @ {info['cpu_mhz']:.0f} MHz" if info.get("cpu_mhz") else ""
    mhz += f" ({info['cpuid']})" if info.get("cpuid") else ""
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v)
    missing = [k for k, v in info["versions"].items() if not v]
    lines = [f"CPU: {info['cpu']}{mhz}; {info['usable_cpus']} usable of {info['logical_cpus']} logical CPUs; "
             f"threads per stack, eager PyTorch included: {info['threads']}",
             f"ISA: {isa}",
             f"Versions: {versions}" + (f" (not installed: {', '.join(missing)})" if missing else "")]
    return lines
