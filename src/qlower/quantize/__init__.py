"""Quantization: qlower's PT2E Quantizer, observers, calibration and the `quantize` entry."""
from __future__ import annotations

import contextlib

import torch
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from ..capture import capture, capture_again, check_example_inputs
from ..errors import QuantizeError
from ..passes.base import PassContext
from ..passes.drop_eval_dropout import DropEvalDropout
from ..shapes import dynamic_spec, user_input_values
from .attention import decompose_attention, decompose_attention_in_module, writes_state
from .calibrate import Calibration, calibrate, fit_batches, user_input_specs
from . import mixed_precision
from .config import AccuracyTarget, QuantConfig, SmoothQuant, WeightOnly
from .quantizer import QlowerQuantizer
from .biascorrect import correct
from .per_token import insert_run_time_qdq
from .smoothquant import smooth
from .weight_only import rewrite_weight_only

__all__ = ["AccuracyTarget", "Calibration", "QuantConfig", "SmoothQuant", "WeightOnly", "rewrite_float",
           "QlowerQuantizer", "quantize", "is_quantized", "calibrate"]

_QDQ_NAMESPACES = ("quantized_decomposed",)
_WEIGHT_ONLY_OPS = (torch.ops.qlower.linear_weight_only.default, torch.ops.qlower.embedding_weight_only.default)
# graph_module.meta key of a quantized program: the mixed-precision PrecisionChoice, if any
PRECISION_CHOICE_KEY = "qlower_precision_choice"
# graph_module.meta key of a weight-only program: what was quantized and what stayed float (report notes)
WEIGHT_ONLY_NOTES_KEY = "qlower_weight_only_notes"


def is_quantized(program) -> bool:
    """True when the graph already holds Q/DQ nodes or weight-only ops (an already-quantized program)."""
    gm = program.graph_module if isinstance(program, torch.export.ExportedProgram) else program
    return any(n.op == "call_function" and (getattr(n.target, "namespace", None) in _QDQ_NAMESPACES
                                            or n.target in _WEIGHT_ONLY_OPS)
               for n in gm.graph.nodes)


def quantize(model, example_inputs, calibration=None, config: QuantConfig | str | None = None,
             dynamic_shapes=None, adjust_observers=None,
             ranked_layers: mixed_precision.RankLayers | None = None) -> torch.export.ExportedProgram:
    """Capture, annotate with `QlowerQuantizer`, calibrate, convert: a Q/DQ ExportedProgram.
    An already-quantized ExportedProgram is returned as is. `adjust_observers(observed)` may
    refine calibrated qparams before convert (a backend's exact-kernel choices). A config with
    an accuracy target needs `ranked_layers` (report.verify.ranked_layers; qlower.quantize and
    qlower.compile pass it)."""
    if isinstance(model, torch.export.ExportedProgram) and is_quantized(model):
        return model
    if isinstance(config, str):
        config = QuantConfig.from_name(config)
    if calibration is None:
        raise QuantizeError("quantization needs calibration data",
                            hint="pass calibration=[(x1,), (x2,), ...] with representative inputs")
    config = config or QuantConfig()
    example_inputs = check_example_inputs(example_inputs)
    calibration = calibration if hasattr(calibration, "__len__") else list(calibration)  # read more than once
    calibration = _fitted(model, example_inputs, calibration, dynamic_shapes)
    if config.target is not None:
        if ranked_layers is None:
            raise QuantizeError("an accuracy target needs a layer ranking",
                                hint="use qlower.quantize or qlower.compile, which measure it")
        program, choice = mixed_precision.choose(
            model, example_inputs, calibration, config,
            lambda c: _quantize_once(model, example_inputs, calibration, c, dynamic_shapes, adjust_observers),
            ranked_layers)
        program.graph_module.meta[PRECISION_CHOICE_KEY] = choice
        return program
    return _quantize_once(model, example_inputs, calibration, config, dynamic_shapes, adjust_observers)


def _fitted(model, example_inputs, calibration, dynamic_shapes) -> list:
    """Calibration batches cut to the program's static batch size where theirs differs
    (calibrate.fit_batches); the model is captured for its input specs only then."""
    shapes = [tuple(t.shape) for t in torch.utils._pytree.tree_leaves(example_inputs) if isinstance(t, torch.Tensor)]

    def same(batch) -> bool:
        leaves = torch.utils._pytree.tree_leaves((batch,) if isinstance(batch, torch.Tensor) else batch)
        return [tuple(t.shape) for t in leaves if isinstance(t, torch.Tensor)] == shapes
    if all(same(b) for b in calibration):
        return calibration
    return fit_batches(list(calibration), user_input_specs(capture(model, example_inputs, dynamic_shapes)))


def _quantize_once(model, example_inputs, calibration, config: QuantConfig, dynamic_shapes,
                   adjust_observers) -> torch.export.ExportedProgram:
    if config.weight_only is not None:
        return _quantize_weight_only(model, example_inputs, calibration, config, dynamic_shapes)
    ep = capture(model, example_inputs, dynamic_shapes)
    _refuse_float64(ep)
    output_dtypes = _output_dtypes(ep.graph_module)
    if config.quantize_attention:
        ep = decompose_attention(ep)
    gm = ep.module()
    if config.quantize_attention and writes_state(ep):
        decompose_attention_in_module(gm)
    _drop_eval_dropouts(gm)
    state_names = [name for name, _ in gm.named_buffers()]
    with _state_restored(gm, state_names):
        rewrite_float(gm, calibration, config)
    observed = prepare_pt2e(gm, QlowerQuantizer(config))
    with _state_restored(observed, state_names):  # calibration must not leave caches filled
        calibrate(observed, calibration)
    if adjust_observers is not None:
        adjust_observers(observed)
    with _state_restored(observed, state_names):  # convert runs a buffer update (`self.n += 1`) once
        converted = convert_pt2e(observed, fold_quantize=True)
        insert_run_time_qdq(converted, config.activations)
    _keep_output_dtypes(converted, output_dtypes)
    # Re-export so callers get a self-contained program with shape metadata on every node
    # (capture: a failure is a CaptureError with a hint, e.g. for a size computed from values).
    return capture_again(converted, example_inputs, _flat_spec(ep, example_inputs, dynamic_shapes))


def _refuse_float64(ep: torch.export.ExportedProgram) -> None:
    """PT2E's quantize ops take float32, bfloat16 and float16 values only (float64 was a raw
    AssertionError inside convert): a float64 model is a typed error; float compiles keep it."""
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder" and isinstance(val, torch.Tensor) and val.dtype is torch.float64:
            raise QuantizeError(f"'{node.name}' is float64: int8 quantization takes float32, float16 or "
                                "bfloat16 models",
                                hint="quantize a float32 copy (model.float() and x.float()), or compile without "
                                     "quantize (float64 runs as float64)")


def _output_dtypes(gm: torch.fx.GraphModule) -> list:
    """The dtype of each output leaf of the captured float program (None: not a tensor)."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    leaves = torch.utils._pytree.tree_leaves(out.args[0])
    return [getattr(getattr(v, "meta", {}).get("val"), "dtype", None) for v in leaves]


def _keep_output_dtypes(gm: torch.fx.GraphModule, dtypes: list) -> None:
    """The float model's output dtypes, kept: a float16 output produced by a dequantize is
    float16 in the Q/DQ form (`out_dtype`), but the integer lowering dequantizes to float32 (a
    float16 `torch.bmm` came back float32). Each float output that is not float32 is cast to its
    dtype explicitly here (a no-op in the Q/DQ form), so every lowering keeps it."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    leaves, spec = torch.utils._pytree.tree_flatten(out.args[0])
    if len(leaves) != len(dtypes):
        return
    changed = False
    for i, (value, dtype) in enumerate(zip(leaves, dtypes)):
        val = getattr(value, "meta", {}).get("val") if isinstance(value, torch.fx.Node) else None
        if dtype is None or not dtype.is_floating_point or dtype is torch.float32 \
                or not isinstance(value, torch.fx.Node):
            continue
        with gm.graph.inserting_before(out):
            cast = gm.graph.call_function(torch.ops.aten._to_copy.default, (value,), {"dtype": dtype})
        if isinstance(val, torch.Tensor):
            cast.meta["val"] = val.to(dtype)
        leaves[i], changed = cast, True
    if changed:
        out.args = (torch.utils._pytree.tree_unflatten(leaves, spec),)
        gm.recompile()


def _quantize_weight_only(model, example_inputs, calibration, config: QuantConfig,
                          dynamic_shapes) -> torch.export.ExportedProgram:
    """Weight-only (quantize/weight_only.py): no observers, no Q/DQ; the linears become
    `qlower.linear_weight_only` ops on the captured float graph, which is exported again."""
    ep = capture(model, example_inputs, dynamic_shapes)
    gm = ep.module()
    _drop_eval_dropouts(gm)
    state_names = [name for name, _ in gm.named_buffers()]
    with _state_restored(gm, state_names):   # AWQ / GPTQ statistics run the model: caches untouched
        ctx = rewrite_weight_only(gm, calibration, config)
    program = torch.export.export(gm, example_inputs, dynamic_shapes=_flat_spec(ep, example_inputs, dynamic_shapes))
    program.graph_module.meta[WEIGHT_ONLY_NOTES_KEY] = [f"weight-only: {config.weight_only.describe()}"] + \
        [f"{what}: {count}" for what, count in ctx.rewrites.items()]
    return program


def _drop_eval_dropouts(gm: torch.fx.GraphModule) -> None:
    """Identity dropouts out before annotation: they hide a linear's quantized output from the
    residual add that reads it (passes/drop_eval_dropout.py)."""
    if DropEvalDropout().run(gm, PassContext()):
        gm.recompile()


def rewrite_float(gm: torch.fx.GraphModule, calibration, config: QuantConfig) -> None:
    """Changes to the float constants before annotation: SmoothQuant (function-preserving),
    then bias correction (which measures the weights SmoothQuant leaves)."""
    if not len(calibration):
        return
    if config.smoothquant is not None:
        smooth(gm, calibration, config.smoothquant, bits=config.linear_weight_bits,   # it smooths linears only
               unsigned=config.activation_dtype == "uint8")
    if config.bias_correction:
        correct(gm, calibration, bits=config.weight_bits, per_channel=config.per_channel)


@contextlib.contextmanager
def _state_restored(module: torch.nn.Module, names: list[str]):
    """Snapshot the model's own buffers (KV caches, recurrent state), restore them afterwards."""
    buffers = dict(module.named_buffers())
    saved = {n: buffers[n].detach().clone() for n in names if n in buffers}
    try:
        yield
    finally:
        live = dict(module.named_buffers())
        with torch.no_grad():
            for n, value in saved.items():
                if n in live and live[n].shape == value.shape:
                    live[n].copy_(value)


def _flat_spec(ep: torch.export.ExportedProgram, example_inputs: tuple, dynamic_shapes):
    """ep.module() takes the user inputs flattened and positional: the dims the capture made
    symbolic (with their ranges) are declared again in that form (a user spec written for
    `forward(*tensors)` or keyword inputs does not fit it)."""
    if dynamic_shapes is None:
        return None
    if len(example_inputs) != len(ep.graph_signature.user_inputs):
        return tuple(dynamic_shapes.values()) if isinstance(dynamic_shapes, dict) else dynamic_shapes
    return dynamic_spec(user_input_values(ep), ranges=ep.range_constraints)
