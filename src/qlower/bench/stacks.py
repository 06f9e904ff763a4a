"""The stacks `qlower bench` compares: how each one turns (model, example inputs, calibration)
into a callable. A peer library that is not installed raises PeerUnavailable with the install
hint; the harness records it as that stack's error row."""
from __future__ import annotations

import dataclasses

import importlib.util
from pathlib import Path
from typing import Callable

import torch

from ..backends.registry import backend_names
from ..api import compile as qcompile, quantize as qquantize
from ..quantize import QuantConfig
from ..backends.onnxruntime import OrtOptions
from ..passes import LowerQDQ, default_pipeline

STACKS = ("eager-fp32", "compile-fp32", "pt2e-inductor-int8", "ort-fp32", "ort-int8-qdq", "ort-int8-dynamic",
          "openvino-fp32", "openvino-nncf-int8",
          "qlower-onnxruntime", "qlower-onnxruntime-fp32", "qlower-onnxruntime-static", "qlower-onnxruntime-dynamic",
          "qlower-onnxruntime-w8",
          "qlower-onnxruntime-qdq",
          "qlower-onnxruntime-qdq-unfused", "qlower-openvino", "qlower-openvino-native", "qlower-iree",
          "qlower-reference")
# The Q/DQ-form stacks answer "integer ops, or Q/DQ form and let the engine fuse?": the same
# quantized program without LowerQDQ, with ONNX Runtime's own QDQ fusions on (-qdq) or off
# (-qdq-unfused: float kernels between Q/DQ). Both are measured against the canonical numerics.
# qlower-openvino-native: OpenVINO's engine-native profile (OvOptions(numerics="openvino")): the
# Q/DQ program on OpenVINO's own int8 kernels, likewise measured against the canonical numerics.
# -static: static activation ranges on a transformer too (the `transformer-static` preset), the
# same scheme as ORT's QDQ peer; the plain stack's `transformer` preset quantizes linear inputs
# per token at run time (more accurate, a row max and a division more per linear).
# -dynamic: linear inputs quantized per tensor at run time (the `transformer-dynamic` preset), the
# same scheme as ORT's dynamic peer (one DynamicQuantizeMatMul per linear).
FORMULATIONS = ("qlower-onnxruntime", "qlower-onnxruntime-qdq", "qlower-onnxruntime-qdq-unfused")
# qlower's int8 in three schemes, each beside ORT's pipeline of the same scheme: per token (the
# `transformer` preset, the most accurate), static (ORT's QDQ), dynamic (ORT's quantize_dynamic)
DEFAULT_STACKS = ("eager-fp32", "compile-fp32", "pt2e-inductor-int8", "ort-fp32", "ort-int8-qdq",
                  "ort-int8-dynamic", "qlower-onnxruntime-fp32", "qlower-onnxruntime", "qlower-onnxruntime-static",
                  "qlower-onnxruntime-dynamic")
QUICK_STACKS = ("eager-fp32", "ort-fp32", "ort-int8-qdq", "qlower-onnxruntime-fp32", "qlower-onnxruntime")

BENCH_EXTRA = "pip install 'qlower[bench]'"
# stack prefix -> (module that must be importable, distribution with its pinned version)
REQUIREMENTS: dict[str, tuple[tuple[str, str], ...]] = {
    "ort-": (("onnxruntime", "onnxruntime==1.31.1"),),
    "openvino-": (("openvino", "openvino==2026.4.1"),),
    "openvino-nncf": (("openvino", "openvino==2026.4.1"), ("nncf", "nncf==3.4.0")),
    "pt2e-": (("torchao", "torchao==0.18.0"),),
    "qlower-openvino": (("openvino", "openvino==2026.4.1"),),
    "qlower-iree": (("iree.compiler", "iree-base-compiler==3.13.0"), ("iree.runtime", "iree-base-runtime==3.13.0")),
}


class PeerUnavailable(RuntimeError):
    """A stack's library is not installed (the row's error says what to install)."""


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):   # a dotted name whose parent package is missing
        return False


def require(stack: str) -> None:
    """Raise PeerUnavailable when a library `stack` needs is missing (longest matching prefix)."""
    prefixes = [p for p in REQUIREMENTS if stack.startswith(p)]
    if not prefixes:
        return
    missing = [dist for module, dist in REQUIREMENTS[max(prefixes, key=len)] if not installed(module)]
    if missing:
        raise PeerUnavailable(f"{' and '.join(m.split('==')[0] for m in missing)} not installed: "
                              f"{BENCH_EXTRA} (or pip install {' '.join(missing)})")


def build_stack(stack: str, entry, model, inputs, calibration, workdir: str) -> Callable:
    """A callable running `model` on `stack`. ONNX-based peers share one fp32 export per
    model and batch (written once into `workdir`)."""
    if stack not in STACKS and not stack.startswith("qlower-"):   # qlower-<backend>[-variant] is open-ended
        raise ValueError(f"unknown stack {stack!r}; choose from {', '.join(STACKS)}")
    require(stack)
    if stack == "eager-fp32":
        return lambda *xs: model(*xs)
    if stack == "compile-fp32":
        return torch.compile(model)
    if stack == "pt2e-inductor-int8":
        return _pt2e_inductor(model, inputs, calibration)
    if stack == "ort-fp32":
        return _ort_runner(_ort_session(fp32_onnx(entry, model, inputs, workdir)))
    if stack == "ort-int8-qdq":
        return _ort_static(entry, model, inputs, calibration, workdir)
    if stack == "ort-int8-dynamic":
        return _ort_dynamic(entry, model, inputs, workdir)
    if stack == "openvino-fp32":
        core = _ov_core()
        return _ov_runner(core, core.read_model(fp32_onnx(entry, model, inputs, workdir)))
    if stack == "openvino-nncf-int8":
        return _ov_nncf(entry, model, inputs, calibration, workdir)
    return _qlower_stack(stack, entry, model, inputs, calibration)


def fp32_onnx(entry, model, inputs, workdir: str) -> str:
    path = Path(workdir) / f"{entry.name}-fp32.onnx"
    if not path.exists():
        torch.onnx.export(model, inputs, str(path), dynamo=True, external_data=False, verbose=False)
    return str(path)


# ------------------------------------------------------------------------------ ONNX Runtime
def _ort_session(path: str):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = torch.get_num_threads()
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _ort_runner(session) -> Callable:
    names = [i.name for i in session.get_inputs()]

    def run(*xs):
        outs = [torch.from_numpy(o) for o in session.run(None, {n: x.numpy() for n, x in zip(names, xs)})]
        return outs[0] if len(outs) == 1 else tuple(outs)
    return run


def _preprocessed(entry, model, inputs, workdir: str, stack: str) -> tuple[str, str | None]:
    """The fp32 export through ORT's `quant_pre_process` (what ORT's quantization docs ask for
    first), and a note when its symbolic shape inference had to be skipped."""
    from onnxruntime.quantization.shape_inference import quant_pre_process
    pre = f"{workdir}/{entry.name}-pre.onnx"
    src, note = fp32_onnx(entry, model, inputs, workdir), None
    try:
        quant_pre_process(src, pre)
    except Exception as exc:   # ORT's symbolic shape inference fails on some exports (Expand on BERT masks)
        quant_pre_process(src, pre, skip_symbolic_shape=True)
        note = (f"note: {stack} on {entry.name}: quant_pre_process without symbolic shape inference "
                f"({type(exc).__name__}: {exc})")
    return pre, note


def _ort_dynamic(entry, model, inputs, workdir: str) -> Callable:
    """ORT's own dynamic int8 pipeline (`quantize_dynamic`: per-channel s8 weights, activations
    quantized per tensor at run time) on the pre-processed export: without pre-processing ONNX's
    shape inference rejected the exports of every model with a Conv (cnn, mobilenet, vit, lstm)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    pre, note = _preprocessed(entry, model, inputs, workdir, "ort-int8-dynamic")
    dst = f"{workdir}/{entry.name}-dyn.onnx"
    quantize_dynamic(pre, dst, weight_type=QuantType.QInt8, per_channel=True)
    run = _ort_runner(_ort_session(dst))
    run.note = note
    return run


def _ort_static(entry, model, inputs, calibration, workdir: str) -> Callable:
    """ORT's own static int8 pipeline: QDQ, per-channel s8 weights, u8 activations."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    pre, note = _preprocessed(entry, model, inputs, workdir, "ort-int8-qdq")
    dst = f"{workdir}/{entry.name}-int8.onnx"
    names = [i.name for i in _ort_session(pre).get_inputs()]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{n: t.numpy() for n, t in zip(names, b)} for b in calibration])

        def get_next(self):
            return next(self.it, None)
    quantize_static(pre, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    run = _ort_runner(_ort_session(dst))
    run.note = note
    return run


# ------------------------------------------------------------------------------ OpenVINO (+ NNCF)
def _ov_core():
    import openvino as ov
    return ov.Core()


def ov_config() -> dict:
    """Latency mode, one stream, the bench's thread count, f32 for float ops (the CPU plugin
    otherwise picks bf16 where the CPU has it, which is not fp32)."""
    return {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": torch.get_num_threads(),
            "INFERENCE_PRECISION_HINT": "f32"}


def _ov_runner(core, ov_model) -> Callable:
    compiled = core.compile_model(ov_model, "CPU", ov_config())
    request = compiled.create_infer_request()
    count = len(compiled.inputs)

    def run(*xs):
        result = request.infer([x.numpy() for x in xs[:count]], share_inputs=True)
        outs = [torch.from_numpy(result[o].copy()) for o in compiled.outputs]
        return outs[0] if len(outs) == 1 else tuple(outs)
    return run


def _is_transformer(model: torch.nn.Module) -> bool:
    return any(isinstance(m, (torch.nn.LayerNorm, torch.nn.MultiheadAttention)) or "Attention" in type(m).__name__
               or "RMSNorm" in type(m).__name__ for m in model.modules())


def _ov_nncf(entry, model, inputs, calibration, workdir: str) -> Callable:
    """NNCF post-training quantization of the OpenVINO model read from the fp32 export
    (performance preset; the transformer model type where the model has attention/norms)."""
    import nncf
    core = _ov_core()
    ov_model = core.read_model(fp32_onnx(entry, model, inputs, workdir))
    dataset = nncf.Dataset(calibration, lambda batch: [t.numpy() for t in batch])
    kwargs = {"model_type": nncf.ModelType.TRANSFORMER} if _is_transformer(model) else {}
    quantized = nncf.quantize(ov_model, dataset, subset_size=len(calibration), **kwargs)
    return _ov_runner(core, quantized)


# ------------------------------------------------------------------------------ PT2E + Inductor
def _pt2e_inductor(model, inputs, calibration):
    import torch._inductor.config as inductor_config
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(), quantizer)
    for batch in calibration:
        prepared(*batch)
    converted = convert_pt2e(prepared)
    inductor_config.freezing = True  # reaches the prepacked int8 kernels (measured: ~2x slower without)
    return torch.compile(converted)


# ------------------------------------------------------------------------------ qlower
def parse_qlower(stack: str) -> tuple[str, str]:
    """'qlower-onnxruntime-qdq-unfused' -> ('onnxruntime', 'qdq-unfused')."""
    rest = stack.removeprefix("qlower-")
    for backend in sorted(backend_names(), key=len, reverse=True):   # longest first: a name may prefix another
        if rest == backend or rest.startswith(backend + "-"):
            return backend, rest[len(backend) + 1:]
    raise ValueError(f"unknown stack {stack!r}; choose from {', '.join(STACKS)}")


def _qlower_stack(stack: str, entry, model, inputs, calibration) -> Callable:
    """A qlower stack, with `.canonical()`: builds the reference backend on the same quantized
    program (called after the stack's prepare time and memory are taken), and `.note` (the
    fallbacks, if any)."""
    backend, variant = parse_qlower(stack)
    if variant == "fp32":   # the float model lowered by qlower (through torch.onnx for onnxruntime)
        cm = qcompile(model, inputs, backend=backend)
        return _with_note(lambda *xs: cm(*xs), cm, stack, entry)
    # the preset a user would pick (the NNCF peer likewise gets its TRANSFORMER model type);
    # a named preset picks the weight width per CPU
    transformer = _is_transformer(model)
    preset = {"static": "transformer-static", "dynamic": "transformer-dynamic"}.get(variant, "transformer") \
        if transformer else "int8"
    config = QuantConfig.from_name(preset) if variant == "w8" else preset
    if variant == "w8":
        config = dataclasses.replace(config, weight_bits=8)
    passes, options = None, None
    if variant == "native":   # OpenVINO's engine-native profile: the Q/DQ program on its int8 kernels
        from ..backends.openvino import OvOptions
        options = OvOptions(numerics="openvino")
    ep = qquantize(model, inputs, calibration, config, backend=backend, backend_options=options)
    if variant.startswith("qdq"):
        passes = [p for p in default_pipeline() if not isinstance(p, LowerQDQ)]
        options = OrtOptions(disabled_optimizers=()) if variant == "qdq" else OrtOptions()
    cm = qcompile(ep, inputs, backend=backend, passes=passes, backend_options=options)

    def run(*xs):
        return cm(*xs)
    run.canonical = lambda: qcompile(ep, inputs, backend="reference")
    return _with_note(run, cm, stack, entry)


def _with_note(run, cm, stack: str, entry) -> Callable:
    fallbacks = cm.report().fallbacks
    if fallbacks:
        reasons: dict[str, list[str]] = {}
        for c in fallbacks:
            reasons.setdefault(c.reason.splitlines()[0][:160] if c.reason else "?", []).append(f"#{c.id}")
        # the most frequent reason first: the terminal shows the note's beginning, bench.log all of it
        run.note = (f"note: {stack} on {entry.name} has {len(fallbacks)} cluster(s) in PyTorch: "
                    + "; ".join(f"{len(ids)}x {reason} ({', '.join(ids)})"
                                for reason, ids in sorted(reasons.items(), key=lambda kv: -len(kv[1]))))
    return run
