"""`qlower device-check`: the zoo compiled here for an IREE device (a GPU), as a bundle that a
machine with only numpy and iree-base-runtime runs and checks.

The bundle holds, per zoo model and mode (int8 under both numerics profiles, fp32): the model's
whole-model module compiled for the target (`qlower.export(..., target=)`), with and without
data tiling for the int8 modes; seeded inputs; the outputs it must reproduce; the same module's
outputs and median latency on this machine's CPU. int8 modules must equal the reference
backend bit for bit where the CPU module does (all-integer models); a model with float islands
(softmax, LayerNorm, GELU between the integer ops: outside the canonical contract) must stay
within twice the CPU module's distance from the reference (at least 1e-6). fp32 modules must stay within a
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
from ..backends.base import compile_graph
from ..backends.iree import IreeBackend
from ..backends.iree.compiler import compile_command, compile_mlir
from ..backends.iree.data_tiling import data_tiling_for
from ..backends.iree.export import whole_model_cluster
from ..backends.iree.options import IreeOptions
from ..backends.iree.runner import IreeCluster
from ..errors import QlowerError
from ..numerics_vectors import EDGE_SCALES, QuantizeDequantize, quantize_edges, tie_vector
from ..timing import median_latency_ms
from ..zoo import get
from .machine import ISA_FLAGS, cpuinfo

MODES = ("int8-fixed", "int8-float", "fp32")
DEFAULT_MODELS = ("cnn", "transformer", "transformer-blockops", "mobilenet", "vit", "bert")


@dataclasses.dataclass
class BundleEntry:
    name: str            # <model>-<mode>[-nodt], or numerics-<case>
    model: str
    mode: str
    vmfb: str            # file name in the bundle
    inputs: list[str]    # .npy file names, in call order
    expected: list[str]  # .npy per output: the reference backend's (int8), eager's (fp32)
    cpu_output: list[str]  # .npy per output: the same module's outputs on this CPU
    exact: bool          # bit-exact (int8 where the CPU module is); else within atol/rtol
    atol: float
    rtol: float
    data_tiling: bool
    cpu_ms: float | None  # the CPU module's median latency here (llvm-cpu, host)
    command: str          # the iree-compile command line that made `vmfb` from the MLIR


@dataclasses.dataclass
class _Case:
    """One module to bundle: the IREE cluster compiled here, its inputs and wanted outputs."""
    key: str
    model: str
    mode: str
    cluster: object                 # IreeCluster (mlir, kind, function)
    inputs: tuple
    want: tuple
    got_cpu: tuple
    exact: bool
    atol: float = 0.0
    rtol: float = 0.0
    tilings: tuple = (True,)


def _float_tolerance(got: torch.Tensor, ref64: torch.Tensor) -> tuple[float, float]:
    """fp32 tolerance from eager's own float32 vs float64 error (x16, at least 1e-4), the fuzz
    harness's rule: a GPU's float kernels may order their sums differently."""
    err = float((got.double() - ref64).abs().max()) if got.numel() else 0.0
    return max(16 * err, 1e-4), 1e-3


def _island_tolerance(got: tuple, want: tuple) -> float:
    """An int8 module with float islands (softmax, LayerNorm, GELU between the integer ops):
    twice the CPU module's distance from the reference, at least 1e-6 (measured on an H200: a
    CPU distance of 6e-8 and a GPU one of 2.4e-7 on the same float-rounding differences)."""
    return max(2 * max(float((g - w).abs().max()) for g, w in zip(got, want)), 1e-6)


def _npy(array: np.ndarray, path: Path) -> str:
    np.save(path, array)
    return path.name


def _to_array(t: torch.Tensor) -> np.ndarray:
    a = t.detach().contiguous().numpy()
    return a.view(np.int8) if a.dtype == np.uint8 else a


def _tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _zoo_case(entry, mode: str, batch: int) -> _Case:
    """A zoo model as one IREE module (QlowerError if it is not one)."""
    import qlower
    model, example, x = entry.model(), entry.inputs(batch), entry.inputs(batch, seed=7)
    if mode == "fp32":
        cm, oracle = qlower.compile(model, example, backend="iree"), model
    else:
        program = qlower.quantize(model, example, entry.calibration(4, batch))
        profile = mode.split("-")[1]
        cm = qlower.compile(program, example, backend="iree", profile=profile)
        oracle = qlower.compile(program, example, backend="reference", profile=profile)
    cluster = whole_model_cluster(cm)
    with torch.no_grad():
        want, got = _tuple(oracle(*x)), _tuple(cm(*x))
    case = _Case(f"{entry.name}-{mode}", entry.name, mode, cluster, x, want, got, exact=mode != "fp32",
                 tilings=(True, False) if mode != "fp32" else (True,))
    if mode == "fp32":
        with torch.no_grad():
            ref64 = _tuple(oracle.double()(*(t.double() if t.is_floating_point() else t for t in x)))
        case.atol, case.rtol = _float_tolerance(got[0], ref64[0])
    elif not all(torch.equal(g, w) for g, w in zip(got, want)):   # float islands
        case.exact, case.atol = False, _island_tolerance(got, want)
    return case


class _Requantize(torch.nn.Module):
    def __init__(self, acc_scales, zp: int, dtype: torch.dtype, profile: str):
        super().__init__()
        self.register_buffer("acc_scale", torch.tensor(acc_scales, dtype=torch.float32))
        qmin, qmax = (0, 255) if dtype == torch.uint8 else (-128, 127)
        self.args = (1.0, zp, qmin, qmax, dtype, 1, profile)

    def forward(self, acc):
        return torch.ops.qlower.requantize(acc, self.acc_scale, *self.args)


def _numerics_modules():
    """(name, module, inputs): requantize on every rounding and multiplier/shift edge under both
    profiles, quantize/dequantize on every float edge (NaN, +-inf, ties) — tests/test_iree.py's
    bit-exactness cases."""
    for profile in ("fixed", "float"):
        for dtype, zp in ((torch.uint8, 0), (torch.uint8, 131), (torch.int8, -3)):
            yield (f"requantize-{profile}-{str(dtype)[6:]}-zp{zp}", _Requantize(EDGE_SCALES, zp, dtype, profile),
                   (tie_vector(len(EDGE_SCALES)),))
    for scale, zp, dtype in ((0.00214854861, 0, torch.uint8), (1.0, 1, torch.uint8), (0.0173, -5, torch.int8)):
        yield (f"quantize-{scale}-{str(dtype)[6:]}-zp{zp}", QuantizeDequantize(scale, zp, dtype),
               (quantize_edges(scale),))


def _numerics_cases():
    for name, module, x in _numerics_modules():
        gm = torch.export.export(module, x).module()
        exe = compile_graph(IreeBackend(), gm)
        clusters = [m for m in exe.module.modules() if isinstance(m, IreeCluster) and m.vmfb is not None]
        assert len(clusters) == 1 and len(exe.clusters) == 1, f"{name}: not one IREE module"
        with torch.no_grad():
            want, got = _tuple(gm(*x)), _tuple(exe.run(*x))
        yield _Case(f"numerics-{name}", "numerics", name.split("-")[0], clusters[0], x, want, got, exact=True)


class _ReluMatmul(torch.nn.Module):
    def forward(self, a, b):
        return torch.relu(a) @ b


def _dynamic_cases(skipped: dict):
    """Modules compiled once with batch and sequence dynamic, each checked at several sizes (one
    entry per size, one module): an int8 batched matmul with dynamic batch, M and K (IREE 3.13's
    CPU data tiling miscompiles it; docs/iree.md, "Dynamic shapes"), int8 linears on [B, S, K],
    and the zoo transformer int8 (float islands: within 2x the CPU module's distance)."""
    import qlower
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=128)
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    linears = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).eval()
    matmul_shapes = lambda b, s: ((b, 4, s, s), (b, 4, s, 8))   # noqa: E731
    cases = [("matmul", _ReluMatmul(), matmul_shapes, ({0: batch, 2: seq, 3: seq}, {0: batch, 2: seq})),
             ("linears", linears, lambda b, s: ((b, s, 64),), ({0: batch, 1: seq},)),
             ("transformer", get("transformer").model(), lambda b, s: ((b, s, 64),), ({0: batch, 1: seq},))]
    sizes = ((2, 16), (1, 2), (3, 20), (2, 33))
    for name, model, shapes, dynamic in cases:
        example = tuple(torch.randn(*sh, generator=g) for sh in shapes(2, 16))
        calibration = [tuple(torch.randn(*sh, generator=g) for sh in shapes(2, 16)) for _ in range(3)]
        program = qlower.quantize(model, example, calibration, dynamic_shapes=dynamic)
        cm = qlower.compile(program, example, backend="iree", profile="fixed", dynamic_shapes=dynamic)
        ref = qlower.compile(program, example, backend="reference", profile="fixed", dynamic_shapes=dynamic)
        try:
            cluster = whole_model_cluster(cm)
        except QlowerError as exc:   # PyTorch code around the module (a size computed outside)
            skipped[f"dynamic-{name}"] = str(exc).splitlines()[0]
            continue
        for b, s in sizes:
            x = tuple(torch.randn(*sh, generator=g) for sh in shapes(b, s))
            with torch.no_grad():
                want, got = _tuple(ref(*x)), _tuple(cm(*x))
            exact = all(torch.equal(w, o) for w, o in zip(want, got))
            atol = 0.0 if exact else _island_tolerance(got, want)
            yield _Case(f"dynamic-{name}-b{b}s{s}", f"dynamic-{name}", "int8-fixed", cluster, x, want, got,
                        exact=exact, atol=atol, tilings=(True, False))


def _write_case(case: _Case, out: Path, base, entries: list) -> float:
    """The case's inputs, outputs and modules (per data-tiling choice) into the bundle."""
    key = case.key
    inputs = [_npy(_to_array(t), out / f"{key}.in{i}.npy") for i, t in enumerate(case.inputs)]
    expected = [_npy(_to_array(t), out / f"{key}.out{i}.npy") for i, t in enumerate(case.want)]
    cpu_output = [_npy(_to_array(t), out / f"{key}.cpu{i}.npy") for i, t in enumerate(case.got_cpu)]
    cpu_ms = _cpu_latency_ms(case.cluster, [_to_array(t) for t in case.inputs])
    input_type = {"tosa": "tosa", "torch": "torch"}[case.cluster.kind]
    # as the backend compiles it: never with data tiling where IREE 3.13 miscompiles the cluster
    resolved, note = data_tiling_for(base.resolved_for(case.cluster.info.ops), case.cluster.fallback)
    for tiling in ((False,) if note and not resolved.data_tiling else case.tilings):
        options = dataclasses.replace(resolved, data_tiling=tiling)
        tag = key if tiling else f"{key}-nodt"
        compiled = compile_mlir(case.cluster.mlir, input_type, options)
        (out / f"{tag}.vmfb").write_bytes(compiled.vmfb)
        entries.append(BundleEntry(tag, case.model, case.mode, f"{tag}.vmfb", inputs, expected, cpu_output,
                                   case.exact, case.atol, case.rtol, tiling, cpu_ms,
                                   compile_command(input_type, options)))
    return cpu_ms


def _cpu_latency_ms(cluster, arrays: list[np.ndarray]) -> float:
    return median_latency_ms(lambda: cluster.function(*arrays), warmup=5, runs=30)[0]


def _cpu_line(info: dict, isa: dict) -> str:
    flags = info.get("flags") or ()
    return ", ".join([info.get("model") or "?", *(name for flag, name in isa.items() if flag in flags)])


def prepare(out: str | Path, target: str, models=DEFAULT_MODELS, batch: int = 8, modes=MODES,
            numerics: bool = True, dynamic: bool = True, progress=print) -> dict:
    """Write the bundle for `target` ("cuda:sm_80", ...) into `out`; returns its manifest.
    `numerics`: also the requantize / quantize edge-case modules; `dynamic`: the modules with
    batch and sequence dynamic, at several sizes."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base = IreeOptions.for_target(target)
    entries, skipped = [], {}
    for name in models:
        entry = get(name)
        for mode in modes:
            try:
                case = _zoo_case(entry, mode, batch)
            except QlowerError as exc:
                skipped[f"{name}-{mode}"] = str(exc).splitlines()[0]
                progress(f"  {name}-{mode}: skipped ({skipped[f'{name}-{mode}'][:100]})")
                continue
            cpu_ms = _write_case(case, out, base, entries)
            progress(f"  {case.key}: bundled (CPU module {cpu_ms:.3f} ms)")
    for case in (_numerics_cases() if numerics else ()):
        _write_case(case, out, base, entries)
        progress(f"  {case.key}: bundled")
    for case in (_dynamic_cases(skipped) if dynamic else ()):
        _write_case(case, out, base, entries)
        progress(f"  {case.key}: bundled")
    here = Path(__file__).resolve()
    shutil.copyfile(here.parent / "device_run.py", out / "run.py")
    shutil.copyfile(here.parents[1] / "backends" / "iree" / "vm.py", out / "vm.py")
    manifest = {"target": target, "driver": base.runtime_driver(), "batch": batch,
                "compiled_on": _cpu_line(cpuinfo(), ISA_FLAGS), "entries": [dataclasses.asdict(e) for e in entries],
                "skipped": skipped}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest
