"""Snap each quantized add's output scale, by a few fp32 ulps, to one where ONNX Runtime's fused
QLinearAdd is proven exact (kernel_proofs.py) — a quantization choice made for this backend,
like the 7-bit weights on CPUs without VNNI.

MLAS's QLinearAdd disagrees with the canonical `Q(DQ(a) + DQ(b))` on a few of the 65,536 input
pairs for about a quarter of random qparams; moving the output scale by at most 8 ulps
(relative change < 1e-6, far below any calibration noise) found an exact one in every case
measured. Runs between calibration and convert, so everything derived from the add's output
scale (the next layer's bias scale, shared qparams) follows. Adds whose qparams are already
proven, or where no nearby scale is, keep their calibrated scale (the emitter then uses
DequantizeLinear/Add/QuantizeLinear, still exact).
"""
from __future__ import annotations

import numpy as np
import torch
from torch.fx import GraphModule, Node

from ...quantize.observers import pin_qparams
from ...onnx.kernel_proofs import qlinear_add_exact

MAX_ULPS = 8


def snap_add_scales(observed: GraphModule) -> int:
    """Pin the output observer of every uint8 add in a calibrated PT2E graph to the nearest
    proven scale; returns how many scales moved."""
    moved = 0
    for node in observed.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.add.Tensor:
            continue
        observers = [_observer(observed, a) for a in node.args[:2]]
        out = _observer(observed, _output_of(node))
        if out is None or any(o is None for o in observers) or \
                any(o.dtype != torch.uint8 for o in (*observers, out)):
            continue
        (sa, za), (sb, zb), (sy, zy) = (_qparams(o) for o in (*observers, out))
        snapped = _nearest_exact(sa, za, sb, zb, sy, zy)
        if snapped is not None and snapped != sy:
            pin_qparams(out, snapped, zy)
            moved += 1
    return moved


def _output_of(add: Node) -> Node | None:
    """The observer node of the add's output: its sole user, or after a fused relu/clamp (the
    lowering clips the add's result, so the add itself is still the one to prove)."""
    node = add
    while len(node.users) == 1:
        user = next(iter(node.users))
        if user.op == "call_module":
            return user
        if user.target not in _FUSED:
            return None
        node = user
    return None


_FUSED = {torch.ops.aten.relu.default, torch.ops.aten.relu_.default, torch.ops.aten.hardtanh.default,
          torch.ops.aten.clamp.default}


def _observer(gm: GraphModule, node) -> torch.nn.Module | None:
    if not isinstance(node, Node) or node.op != "call_module":
        return None
    module = gm.get_submodule(node.target)
    return module if hasattr(module, "calculate_qparams") and hasattr(module, "dtype") else None


def _qparams(observer) -> tuple[float, int]:
    scale, zp = observer.calculate_qparams()
    return float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0])


def _nearest_exact(sa, za, sb, zb, sy, zy) -> float | None:
    if qlinear_add_exact(sa, za, sb, zb, sy, zy):
        return sy
    up = down = np.float32(sy)
    for _ in range(MAX_ULPS):
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(0))
        for candidate in (float(up), float(down)):
            if qlinear_add_exact(sa, za, sb, zb, candidate, zy):
                return candidate
    return None
