"""Per-layer quantization sensitivity: SQNR of every quantized op's output against the same op
in the fp32 model, on the same inputs. Built on torchao's PT2E numeric debugger, which carries a
debug handle from each float node to its quantized counterpart."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from ..capture import capture
from ..quantize import QlowerQuantizer, QuantConfig, calibrate, rewrite_float
from ..quantize.per_token import insert_run_time_qdq

LAYER_OPS = ("conv1d", "conv2d", "linear", "matmul", "bmm", "addmm", "mm")


@dataclass(frozen=True)
class LayerSensitivity:
    node: str                 # fp32 graph node name
    op: str                   # aten op name
    module: str               # nn.Module path that produced it
    sqnr_db: float            # output SQNR vs fp32 (higher is better)

    def __str__(self) -> str:
        return f"{self.sqnr_db:7.1f} dB  {self.op:8s} {self.module or self.node}"


def sensitivity(model: torch.nn.Module, example_inputs: tuple, calibration, config=None,
                inputs: tuple | None = None) -> list[LayerSensitivity]:
    """SQNR (dB) of each conv/linear/matmul output after quantization with qlower's quantizer,
    worst first. `inputs` (default: example_inputs) is what both models run on."""
    from torchao.quantization.pt2e import (compare_results, extract_results_from_loggers,
                                           generate_numeric_debug_handle, prepare_for_propagation_comparison)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e


    config = QuantConfig.from_name(config) if isinstance(config, str) else (config or QuantConfig())
    inputs = inputs or example_inputs
    ep = capture(model, example_inputs)
    generate_numeric_debug_handle(ep)
    float_gm = ep.module()
    reference = prepare_for_propagation_comparison(copy.deepcopy(float_gm))
    calibration = calibration if hasattr(calibration, "__len__") else list(calibration)
    rewrite_float(float_gm, calibration, config)  # SmoothQuant / bias correction, as quantize() does
    observed = prepare_pt2e(float_gm, QlowerQuantizer(config))
    calibrate(observed, calibration)
    converted = convert_pt2e(observed)
    insert_run_time_qdq(converted, config.activations)
    quantized = prepare_for_propagation_comparison(converted)
    with torch.no_grad():
        reference(*inputs)
        quantized(*inputs)
    results = compare_results(extract_results_from_loggers(reference), extract_results_from_loggers(quantized))
    layers = []
    for summary in results.values():
        op = summary.ref_node_name.rstrip("_0123456789")
        if op not in LAYER_OPS or not summary.results:
            continue
        value = summary.results[0].sqnr
        value = float(value[0] if isinstance(value, (list, tuple)) else value)
        module = summary.ref_module_stack.split(",")[-1].strip(" '\"{}") if summary.ref_module_stack else ""
        layers.append(LayerSensitivity(summary.ref_node_name, op, module, value if math.isfinite(value) else math.inf))
    return sorted(layers, key=lambda layer: layer.sqnr_db)
