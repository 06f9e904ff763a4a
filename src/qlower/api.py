"""The public face: compile(), quantize(), capture(), export(), load()."""
from __future__ import annotations

import functools
import time
from pathlib import Path

import torch

from . import blockops, ops  # noqa: F401  (registers qlower ops and block ops)
from .backends import EXPORT_FORMATS, get_backend, op_counts
from .backends.base import compile_graph
from .engine_choice import Program, ProgramKey, auto_backends, choice_note, default_selector, source_digest
from .capture import capture, check_example_inputs, check_module, eval_mode, save_pt2, serialized
from .fx import forgets_discarded_graphs
from .errors import InputError, QlowerError, QuantizeError
from .numerics import PROFILES
from .passes import PassContext, PassManager, default_pipeline
from .quantize import (PRECISION_CHOICE_KEY, WEIGHT_ONLY_NOTES_KEY, QuantConfig, is_quantized, quantize as _quantize,
                       _state_restored)
from .quantize.calibrate import prepare_calibration
from .core.memory import release_freed_memory
from .core.progress import PhaseProgress
from .core.quiet import quiet
from .core.types import CompileReport
from .report.verify import ranked_layers
from .runtime import CompiledModule, input_specs_of
from .runtime.compiled import NAN_POLICIES


@quiet
@serialized   # one compile at a time per process (capture.COMPILE_LOCK says why)
@forgets_discarded_graphs
def quantize(model, example_inputs, calibration=None, config: QuantConfig | str | None = None,
             dynamic_shapes=None, backend: str | None = None, backend_options=None) -> torch.export.ExportedProgram:
    """Q/DQ ExportedProgram of `model` (an already-quantized program is returned as is).

    backend: quantize for this backend as `compile` does (e.g. "onnxruntime": the "int8" preset
    gets 7-bit weights on CPUs without VNNI, and add scales snap to the backend's exact kernels);
    None quantizes backend-neutrally. backend_options: as for `compile` (e.g. OpenVINO's
    engine-native numerics keep the calibrated scales)."""
    check_module(model)
    _check_quantize_arg(config, "config")
    if calibration is not None and not (isinstance(model, torch.export.ExportedProgram) and is_quantized(model)):
        calibration = prepare_calibration(calibration, example_inputs)
    if backend is None:
        return _quantize(model, example_inputs, calibration, config, dynamic_shapes, ranked_layers=ranked_layers)
    chosen = get_backend(backend, backend_options)
    config, _ = _config_for_backend(config, chosen)
    return _quantize(model, example_inputs, calibration, config, dynamic_shapes,
                     adjust_observers=getattr(chosen, "adjust_observers", None), ranked_layers=ranked_layers)


@quiet
@serialized   # one compile at a time per process (capture.COMPILE_LOCK says why)
@forgets_discarded_graphs
def compile(model, example_inputs, quantize=None, calibration=None, backend: str = "auto",
            dynamic_shapes=None, profile: str = "float", backend_options=None, passes=None,
            nan_policy: str = "warn", auto_candidates=None) -> CompiledModule:
    """Capture, (optionally) quantize, lower to integer ops, compile on `backend`.

    backend:  "auto" (default): every installed candidate engine (onnxruntime, openvino, iree) is
              compiled, checked against the reference backend on the example inputs and timed;
              the fastest correct one is kept and `report()` says what was tried and why
              (docs/architecture.md, "Engine choice"). A backend name means exactly that backend.
    auto_candidates: the engines "auto" may choose from, e.g. ("onnxruntime", "openvino");
              default $QLOWER_AUTO_BACKENDS (comma list, read at import), else all of them.
              A single candidate is used without measuring.
    quantize: None (float model, or an already-quantized program), "int8", or a QuantConfig.
    profile:  requantization numerics profile, "float" (ONNX Runtime) or "fixed" (TOSA).
    backend_options: e.g. qlower.backends.onnxruntime.OrtOptions(threads=1, optimization="basic").
    passes:   the graph passes to run, default `qlower.passes.default_pipeline()`; a list of your
              own extends or replaces it (dropping LowerQDQ leaves the program in Q/DQ form,
              whose numerics are then the backend's, not qlower's canonical ones).
    nan_policy: what a quantized model does with a float input holding NaN/inf (quantization maps
              NaN to a finite integer): "warn" once (default), "raise" NonFiniteInputError, or
              "ignore" (no check, no cost). Float models follow IEEE arithmetic and are not checked.
    The caller's model keeps its train/eval mode (it is compiled in eval mode)."""
    check_module(model)
    started = time.perf_counter()
    with eval_mode(model), PhaseProgress("qlower compile") as say:
        compiled = _compile(model, example_inputs, quantize, calibration, backend, dynamic_shapes, profile,
                            backend_options, passes, nan_policy, auto_candidates, started, say)
    release_freed_memory()   # what the compile freed, back to the OS (core/memory.py)
    return compiled


def _compile(model, example_inputs, quantize, calibration, backend, dynamic_shapes, profile, backend_options,
             passes, nan_policy, auto_candidates, started, say) -> CompiledModule:
    example_inputs = check_example_inputs(example_inputs)
    _check_quantize_arg(quantize, "quantize")
    notes: list[str] = []
    if profile not in PROFILES:
        raise QlowerError(f"unknown numerics profile {profile!r}", hint=f"use one of {PROFILES}")
    if nan_policy not in NAN_POLICIES:
        raise InputError(f"unknown nan_policy {nan_policy!r}", hint=f"use one of {NAN_POLICIES}")
    quantizing = quantize is not None and quantize is not False
    if quantizing:
        if calibration is None and not (isinstance(model, torch.export.ExportedProgram) and is_quantized(model)):
            raise QuantizeError("quantize was requested but no calibration data was given",
                                hint="pass calibration=[(x,), ...] with a few representative inputs")
        if calibration is not None:
            calibration = prepare_calibration(calibration, example_inputs)
    if auto_candidates is not None and backend != "auto":
        raise QlowerError(f"auto_candidates is for backend='auto', not backend={backend!r}")

    prequantized = isinstance(model, torch.export.ExportedProgram) and is_quantized(model)
    requantizes = quantizing and not prequantized

    def pipeline_for(chosen) -> list:
        """The passes to run: the user's list as given, else the default pipeline as the backend
        adapts it (`Backend.pipeline`, e.g. OpenVINO's engine-native mode keeps the Q/DQ form)."""
        if passes is not None:
            return list(passes)
        adapt = getattr(chosen, "pipeline", None)
        return default_pipeline() if adapt is None else adapt(default_pipeline())

    def stages(chosen) -> tuple[str, ...]:
        return tuple(type(p).__name__ for p in pipeline_for(chosen))

    def program_key(chosen) -> ProgramKey:
        """Equal keys: equal programs (onnxruntime snaps add scales, maybe 7-bit weights; a
        backend may run a different pipeline). A backend adjusting no qparams shares another
        candidate's program of the same config (engine_choice.ProgramKey)."""
        if not requantizes:
            return ProgramKey("", None, stages(chosen))   # nothing is quantized here: the pipeline decides
        config, _ = _config_for_backend(quantize, chosen)
        hook = getattr(chosen, "adjust_observers", None)
        return ProgramKey(repr(config), None if hook is None else f"{hook.__module__}.{hook.__qualname__}",
                          stages(chosen))

    @functools.cache
    def source() -> torch.export.ExportedProgram:
        """The model captured once; every candidate's program is built from it."""
        say("capturing the model")
        return capture(model, example_inputs, dynamic_shapes)

    def build(chosen) -> Program:
        """Quantize `source()` for `chosen` (an accuracy target measures the float model itself),
        then run the pass pipeline."""
        program_notes, label = [], ""
        if quantizing:
            config, note = _config_for_backend(quantize, chosen)
            say(f"quantizing for {chosen.name}" if requantizes else "reading the quantized program")
            program_notes += [note] if note else []
            hook = getattr(chosen, "adjust_observers", None)
            ep = _quantize(model if config.target is not None else source(), example_inputs, calibration, config,
                           dynamic_shapes, adjust_observers=hook, ranked_layers=ranked_layers)
            choice = ep.graph_module.meta.get(PRECISION_CHOICE_KEY)
            program_notes += [str(choice)] if choice is not None else []
            program_notes += ep.graph_module.meta.get(WEIGHT_ONLY_NOTES_KEY, [])
            adapted = passes is None and stages(chosen) != tuple(type(p).__name__ for p in default_pipeline())
            label = ", ".join([f"{config.describe_weights()}, {config.activations} activations"]
                              + ([f"qparams adjusted for {chosen.name}"] if hook is not None else [])
                              + ([f"passes adapted for {chosen.name}"] if adapted else [])) if requantizes else ""
        else:
            ep = source()
        gm = _inference_state(ep.module())
        say(f"lowering for {chosen.name}")
        ctx = PassManager(pipeline_for(chosen)).run(gm, PassContext(profile=profile))
        return Program(program_key(chosen), label, ep, gm, ctx, program_notes)

    if backend == "auto":
        selector = default_selector()
        backends, why = auto_backends(selector.candidate_names(auto_candidates), backend_options,
                                      native=requantizes and profile == "float")
        selection = selector.select(backends, program_key, build, example_inputs, profile, why_unmeasured=why,
                                    float_outputs=lambda: (_float_outputs(model, example_inputs)
                                                           if requantizes or prequantized else None),
                                    source_digest=lambda: source_digest(source(), calibration if requantizes else None),
                                    started=started, progress=say)
        chosen, program, executable = selection.backend, selection.program, selection.executable
    else:
        chosen = get_backend(backend, backend_options)
        program = build(chosen)
        say(f"compiling for {chosen.name}")
        executable = compile_graph(chosen, program.gm)
    ep, gm, ctx = program.ep, program.gm, program.ctx
    notes += program.notes
    report = CompileReport(backend=chosen.name, profile=profile, quantized=is_quantized(ep),
                           clusters=executable.clusters, rewrites=dict(ctx.rewrites),
                           refusals=[str(r) for r in ctx.refusals], op_counts=op_counts(gm))
    if requantizes and not report.quantized:   # no tensor the quantizer annotates (e.g. constant outputs)
        notes.append("nothing to quantize: no op of this model is quantized by int8, so it is compiled as float")
    if backend == "auto":
        report.notes.append(choice_note(chosen))
        report.engine_trials, report.engine_choice = selection.trials, selection.explanation
    report.notes += notes + executable.notes
    dyn = tuple(dynamic_shapes.values()) if isinstance(dynamic_shapes, dict) else dynamic_shapes
    cm = CompiledModule(gm, executable, input_specs_of(gm, ep.range_constraints), report, example_inputs, dyn,
                        backend_options=getattr(chosen, "options", None), nan_policy=nan_policy)
    cm.quantized_program = ep if report.quantized else None   # export's Q/DQ form lowers it
    return cm


def _float_outputs(model, example_inputs):
    """The float model's outputs on the example inputs (engine choice compares the accuracy of
    different quantized programs with them, and an engine's with the reference backend's); for
    a program quantized before compile, its own Q/DQ simulation in float, the nearest to a float
    model there is. The model's buffers are restored afterwards."""
    module = model.module() if isinstance(model, torch.export.ExportedProgram) else model
    with torch.no_grad(), _state_restored(module, [n for n, _ in module.named_buffers()]):
        return module(*example_inputs)


def _check_quantize_arg(value, name: str) -> None:
    """quantize=True (or any non-preset) is a common guess; say what is accepted."""
    if value is None or value is False or isinstance(value, (str, QuantConfig)):
        return
    raise QuantizeError(f"{name}={value!r} is not a quantization setting",
                        hint=f"pass {name}='int8' (or 'transformer', 'int8-symmetric', ...) or a qlower.QuantConfig")


def _inference_state(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Buffers that carry autograd history (module state written under grad mode, e.g.
    transformers' StaticCache) are detached in place: compiled models run inference only."""
    for module in gm.modules():
        for name, buf in list(module._buffers.items()):
            if buf is not None and buf.grad_fn is not None:
                module._buffers[name] = buf.detach()
    return gm


def _config_for_backend(quantize: QuantConfig | str | None, backend) -> tuple[QuantConfig, str | None]:
    """The QuantConfig to quantize with for `backend`: a named preset may be adapted by the
    backend's `quant_config(config, preset=True)` (e.g. 7-bit weights where its kernels need
    them), with a note for the report; an explicit QuantConfig is passed as preset=False."""
    config = QuantConfig.from_name(quantize) if isinstance(quantize, str) else (quantize or QuantConfig())
    adapt = getattr(backend, "quant_config", None)
    if adapt is None or config.weight_only is not None:   # backends adapt activation and int8 weight schemes
        return config, None
    return adapt(config, preset=not isinstance(quantize, QuantConfig))


@quiet
def export(model_or_cm, path: str | Path, format: str = "pt2", example_inputs=None, target: str | None = None,
           onnx_ops: str = "standard") -> Path:
    """Write a model to disk. The engine formats are lowered from the model's quantized program,
    whatever backend it was compiled for (a model from `qlower.load` included); each needs one
    cluster of that engine to cover the whole model, else a BackendError names the nodes outside
    it. The file takes the model's inputs by their argument names and returns its outputs under
    the names of its output structure (`last_hidden_state`, a dict's keys, `output_0`, ...);
    dims compiled dynamic stay symbolic.
    "pt2":  a torch.export program (a CompiledModule keeps its lowering).
    "onnx": one ONNX file (docs/export.md). onnx_ops="standard" (default): standard ai.onnx
            operators only, for any ONNX consumer; the file's metadata says which numerics it
            carries and how far ONNX Runtime and OpenVINO were from qlower's output on the
            example inputs. onnx_ops="onnxruntime": ONNX Runtime's contrib kernels (QGemm,
            QLinearAdd, ...), bit-exact with qlower on ONNX Runtime only. onnx_ops="qdq":
            the quantized program before qlower's lowering, QuantizeLinear / DequantizeLinear
            around float ops, which consumers fuse into their own int8 kernels (their rounding,
            not qlower's; measured in the metadata); needs a model compiled in this process.
    "mlir": the whole model's MLIR as the iree backend emits it (TOSA + linalg, or the torch
            dialect), with `//` lines naming the entry function and the iree-compile command;
    "vmfb": the compiled IREE module (`iree-run-module --module=m.vmfb --function=main`).
    An nn.Module / program is compiled (unquantized) for the format's engine first; pass a
    CompiledModule to export int8.
    target: mlir / vmfb only: the IREE target to compile the module for instead of the one it
            runs on here, "backend[:architecture]": "cuda:sm_80", "rocm:gfx942",
            "vulkan-spirv:ampere", "llvm-cpu:znver4" (compile and check here, deploy elsewhere)."""
    path = Path(path)
    if onnx_ops != "standard" and format != "onnx":
        raise QlowerError(f"onnx_ops={onnx_ops!r} applies to format 'onnx', not {format!r}")
    if target is not None and format not in EXPORT_FORMATS:
        raise QlowerError(f"target={target!r} applies to the IREE formats (mlir, vmfb), not {format!r}")
    if format != "pt2" and format not in EXPORT_FORMATS:
        raise QlowerError(f"export format {format!r} is not available",
                          hint="use one of " + ", ".join(repr(f) for f in ("pt2", *EXPORT_FORMATS)))
    if format in EXPORT_FORMATS:
        backend = get_backend(EXPORT_FORMATS[format])
        if not isinstance(model_or_cm, CompiledModule):
            if example_inputs is None:
                raise QlowerError(f"exporting a model to {format} needs example_inputs")
            model_or_cm = compile(model_or_cm, example_inputs, backend=backend.name)
        if target is not None:
            if not getattr(backend, "export_targets", False):   # the backend cross-compiles its export
                raise QlowerError(f"target={target!r} applies to the IREE formats (mlir, vmfb), not {format!r}")
            return backend.export(model_or_cm, path, format, target)
        if onnx_ops != "standard":
            return backend.export(model_or_cm, path, format, onnx_ops=onnx_ops)
        return backend.export(model_or_cm, path, format)
    if isinstance(model_or_cm, CompiledModule):
        return model_or_cm.save(path)
    if example_inputs is None and not isinstance(model_or_cm, torch.export.ExportedProgram):
        raise QlowerError("exporting an nn.Module needs example_inputs")
    return save_pt2(capture(model_or_cm, example_inputs), path)


