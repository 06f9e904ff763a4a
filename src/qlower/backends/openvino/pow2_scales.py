"""Power-of-two activation scales: the quantization choice that lets OpenVINO run quantize
canonically (a calibration-time observer adjustment, like onnxruntime's snapped add scales).

OpenVINO quantizes x / s as x * fp32(1/s) (capability.py); the two agree for every x exactly
when 1/s is exact, i.e. s is a power of two. So, quantizing for openvino with the canonical
numerics, every activation observer's scale is rounded UP to the next power of two (the
calibrated range stays covered) and its zero point re-centred to keep the range's lower end.
Then no `quantize` node is refused and the graph stays one OpenVINO cluster. Costs up to one
bit of activation resolution (measured on the zoo: tests/test_openvino.py).
Weight observers (their input is a parameter) are left alone: weights are quantized at compile
time, not by OpenVINO.
"""
from __future__ import annotations

import math

import torch
from torch.fx import GraphModule

from ...quantize.observers import pin_qparams


def snap_to_power_of_two(observed: GraphModule) -> int:
    """Pin every per-tensor activation observer of a calibrated PT2E graph to a power-of-two
    scale; returns how many scales moved."""
    moved = 0
    for node in observed.graph.nodes:
        if node.op != "call_module" or not node.args:
            continue
        observer = observed.get_submodule(node.target)
        if not (hasattr(observer, "calculate_qparams")
                and getattr(observer, "dtype", None) in (torch.uint8, torch.int8)):
            continue
        if getattr(node.args[0], "op", None) == "get_attr":
            continue   # a weight
        scale, zp = observer.calculate_qparams()
        if scale.numel() != 1:
            continue   # per-channel: a weight
        s, z = float(scale.reshape(())), int(zp.reshape(()))
        snapped = power_of_two_at_least(s)
        if snapped == s:
            continue
        qmin, qmax = int(observer.quant_min), int(observer.quant_max)
        low = (qmin - z) * s                       # keep the range's lower end where it was
        new_zp = 0 if z == 0 else min(max(round(qmin - low / snapped), qmin), qmax)   # symmetric stays symmetric
        pin_qparams(observer, snapped, new_zp)
        moved += 1
    return moved


def power_of_two_at_least(scale: float) -> float:
    """The smallest power of two >= scale (a normal fp32)."""
    mantissa, exponent = math.frexp(scale)
    return scale if mantissa == 0.5 else math.ldexp(1.0, exponent)
