"""`qlower device-check`: the zoo compiled here for an IREE device (a GPU), as a bundle that a
machine with only numpy and iree-base-runtime runs and checks.

The bundle holds, per zoo model and mode (int8 under both numerics profiles, fp32): the model's
whole-model module compiled for the target (`qlower.export(..., target=)`), with and without
data tiling for the int8 modes; seeded inputs; the outputs it must reproduce; the same module's
outputs and median latency on this machine's CPU. int8 modules must equal the reference
backend bit for bit where the CPU module does (all-integer models); a model with float islands
(softmax, LayerNorm, GELU between the integer ops: outside the canonical contract) must stay
within twice the CPU module's distance from the reference. fp32 modules must stay within a
float tolerance of eager PyTorch. `run.py` and `vm.py` (copied from
qlower) check and time it there:

    qlower device-check bundle --iree-target cuda:sm_80          # here
    python bundle/run.py bundle --driver cuda > results.json     # on the device's host

Only models that are ONE IREE module here are bundled (others are listed as skipped, with why).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import torch

MODES = ("int8-fixed", "int8-float", "fp32")
DEFAULT_MODELS = ("cnn", "transformer", "transformer-blockops", "mobilenet", "vit", "bert")


@dataclasses.dataclass
class BundleEntry:
    name: str            # <model>-<mode>[-nodt]
    model: str
    mode: str
    vmfb: str            # file name in the bundle
    inputs: list[str]    # .npy file names, in call order
    expected: str        # .npy file name: the reference backend's outputs (int8), eager's (fp32)
    cpu_output: str      # .npy file name: the same module's outputs on this CPU
    exact: bool          # bit-exact (int8 where the CPU module is); else within atol/rtol
    atol: float
    rtol: float
    data_tiling: bool
    cpu_ms: float | None  # the CPU module's median latency here (llvm-cpu, host), None if not timed
    command: str          # the iree-compile command line that made `vmfb` from the MLIR


def _float_tolerance(got: torch.Tensor, ref64: torch.Tensor) -> tuple[float, float]:
    """fp32 tolerance from eager's own float32 vs float64 error (x16, at least 1e-4), the fuzz
    harness's rule: a GPU's float kernels may order their sums differently."""
    err = float((got.double() - ref64).abs().max()) if got.numel() else 0.0
    return max(16 * err, 1e-4), 1e-3


def _npy(array: np.ndarray, path: Path) -> str:
    np.save(path, array)
    return path.name


def _to_array(t: torch.Tensor) -> np.ndarray:
    a = t.detach().contiguous().numpy()
    return a.view(np.int8) if a.dtype == np.uint8 else a


def _compiled_pair(entry, mode: str, batch: int):
    """(module compiled on iree for this CPU, the function whose outputs it must reproduce, exact)."""
    import qlower
    model, example = entry.model(), entry.inputs(batch)
    if mode == "fp32":
        cm = qlower.compile(model, example, backend="iree")
        return cm, model, False
    program = qlower.quantize(model, example, entry.calibration(4, batch))
    profile = mode.split("-")[1]
    cm = qlower.compile(program, example, backend="iree", profile=profile)
    return cm, qlower.compile(program, example, backend="reference", profile=profile), True


def _cpu_latency_ms(cluster, arrays: list[np.ndarray]) -> float:
    from ..timing import median_latency_ms
    return median_latency_ms(lambda: cluster.function(*arrays), warmup=5, runs=30)[0]


def _cpu_line(info: dict, isa: dict) -> str:
    flags = info.get("flags") or ()
    return ", ".join([info.get("model") or "?", *(name for flag, name in isa.items() if flag in flags)])


def prepare(out: str | Path, target: str, models=DEFAULT_MODELS, batch: int = 8, modes=MODES,
            progress=print) -> dict:
    """Write the bundle for `target` ("cuda:sm_80", ...) into `out`; returns its manifest."""
    from ..backends.iree.compiler import compile_command, compile_mlir
    from ..backends.iree.export import whole_model_cluster
    from ..backends.iree.options import IreeOptions
    from ..errors import QlowerError
    from ..zoo import get
    from .machine import ISA_FLAGS, cpuinfo
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base = IreeOptions.for_target(target)
    entries, skipped = [], {}
    for name in models:
        entry = get(name)
        x = entry.inputs(batch, seed=7)
        for mode in modes:
            key = f"{name}-{mode}"
            try:
                cm, oracle, exact = _compiled_pair(entry, mode, batch)
                cluster = whole_model_cluster(cm)
            except QlowerError as exc:
                skipped[key] = str(exc).splitlines()[0]
                progress(f"  {key}: skipped ({skipped[key][:100]})")
                continue
            with torch.no_grad():
                want = oracle(*x)
                got_cpu = cm(*x)
            inputs = [_npy(_to_array(t), out / f"{key}.in{i}.npy") for i, t in enumerate(x)]
            expected = _npy(_to_array(want), out / f"{key}.out.npy")
            cpu_output = _npy(_to_array(got_cpu), out / f"{key}.cpu.npy")
            atol, rtol = 0.0, 0.0
            if not exact:
                with torch.no_grad():
                    ref64 = oracle.double()(*(t.double() if t.is_floating_point() else t for t in x))
                atol, rtol = _float_tolerance(got_cpu, ref64)
            elif not torch.equal(got_cpu, want):   # float islands: the CPU module's distance, x2
                exact, atol = False, 2 * float((got_cpu - want).abs().max())
            cpu_ms = _cpu_latency_ms(cluster, [_to_array(t) for t in x])
            for tiling in ((True, False) if mode != "fp32" else (True,)):
                options = dataclasses.replace(base, data_tiling=tiling)
                input_type = {"tosa": "tosa", "torch": "torch"}[cluster.kind]
                tag = key if tiling else f"{key}-nodt"
                compiled = compile_mlir(cluster.mlir, input_type, options)
                (out / f"{tag}.vmfb").write_bytes(compiled.vmfb)
                entries.append(BundleEntry(tag, name, mode, f"{tag}.vmfb", inputs, expected, cpu_output, exact, atol, rtol,
                                           tiling, cpu_ms, compile_command(input_type, options)))
            progress(f"  {key}: bundled (CPU module {cpu_ms:.3f} ms)")
    here = Path(__file__).resolve()
    shutil.copyfile(here.parent / "device_run.py", out / "run.py")
    shutil.copyfile(here.parents[1] / "backends" / "iree" / "vm.py", out / "vm.py")
    manifest = {"target": target, "driver": base.runtime_driver(), "batch": batch,
                "compiled_on": _cpu_line(cpuinfo(), ISA_FLAGS), "entries": [dataclasses.asdict(e) for e in entries],
                "skipped": skipped}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest
