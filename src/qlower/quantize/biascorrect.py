"""Bias correction (Nagel et al. 2019, empirical form) on the captured float graph.

Rounding a layer's weights to int8 changes its output by (Q(W) - W) x, which is not zero-mean
per output channel: over the calibration data it shifts each channel's mean by
E[op(x, Q(W) - W)], and ReLU/pooling downstream turn such shifts into real errors. The
correction subtracts that measured shift from the bias (a layer without a bias gets one), so
the quantized layer's mean output matches the float layer's on the calibration set. Q(W) is
computed exactly as the quantizer will (symmetric, per output channel or per tensor), after
BatchNorm was folded into the convolutions (done here first, as prepare_pt2e would).
Numbers on the zoo CNNs: docs/accuracy.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node

from ..capture import check_example_inputs
from .smoothquant import get_constant, set_constant

aten = torch.ops.aten
LAYERS = {aten.conv1d.default: 1, aten.conv2d.default: 1, aten.linear.default: -1}  # op -> channel dim


@dataclass(frozen=True)
class BiasShift:
    node: str
    max_abs_shift: float      # largest |E[op(x, Q(W) - W)]| over output channels


def quantize_weight(w: torch.Tensor, bits: int, per_channel: bool) -> torch.Tensor:
    """Symmetric weight fake-quantization as QlowerQuantizer's weight observers produce it."""
    bound = (1 << (bits - 1)) - 1
    dims = tuple(range(1, w.dim()))
    amax = w.abs().amax(dim=dims, keepdim=True) if per_channel else w.abs().amax()
    scale = (amax / bound).clamp_min(2**-12)
    return torch.clamp(torch.round(w / scale), -bound, bound) * scale


def layers(gm: GraphModule) -> list[Node]:
    """conv/linear nodes whose weight is a constant used by that node only."""
    uses: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            uses[n.target] = uses.get(n.target, 0) + len(n.users)
    out = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in LAYERS and isinstance(n.args[1], Node) \
                and n.args[1].op == "get_attr" and uses.get(n.args[1].target) == 1:
            bias = n.args[2] if len(n.args) > 2 else None
            if bias is None or (isinstance(bias, Node) and bias.op == "get_attr" and uses.get(bias.target) == 1):
                out.append(n)
    return out


class _ShiftMeter(torch.fx.Interpreter):
    """Runs the float graph; for each layer accumulates the per-channel sum of op(x, dW)."""

    def __init__(self, gm: GraphModule, deltas: dict[Node, torch.Tensor]):
        super().__init__(gm)
        self.deltas = deltas
        self.sums: dict[Node, torch.Tensor] = {}
        self.counts: dict[Node, int] = {}

    def run_node(self, n: Node):
        if n in self.deltas:
            x = self.env[n.args[0]]
            y = n.target(x, self.deltas[n], None, *n.args[3:], **n.kwargs)
            dim = LAYERS[n.target] % y.dim()
            flat = y.detach().movedim(dim, -1).reshape(-1, y.shape[dim]).double()
            self.sums[n] = self.sums.get(n, 0) + flat.sum(dim=0)
            self.counts[n] = self.counts.get(n, 0) + flat.shape[0]
        return super().run_node(n)


def correct(gm: GraphModule, calibration, bits: int = 8, per_channel: bool = True) -> list[BiasShift]:
    """Fold BatchNorm, measure each layer's mean output shift from weight rounding on the
    calibration inputs, subtract it from the bias. Returns the shifts, largest first."""
    from torchao.quantization.pt2e.utils import _fuse_conv_bn_, _fuse_linear_bn_
    _fuse_conv_bn_(gm)
    _fuse_linear_bn_(gm)
    nodes = layers(gm)
    deltas = {}
    for n in nodes:
        w = get_constant(gm, n.args[1].target).detach().float()
        deltas[n] = quantize_weight(w, bits, per_channel) - w
    meter = _ShiftMeter(gm, deltas)
    with torch.no_grad():
        for batch in calibration:
            meter.run(*check_example_inputs(batch))
    shifts = []
    for n in nodes:
        if n not in meter.sums:
            continue
        mean = (meter.sums[n] / meter.counts[n]).float()
        _subtract_from_bias(gm, n, mean)
        shifts.append(BiasShift(n.name, float(mean.abs().max())))
    gm.recompile()
    return sorted(shifts, key=lambda s: -s.max_abs_shift)


def _subtract_from_bias(gm: GraphModule, node: Node, shift: torch.Tensor) -> None:
    bias = node.args[2] if len(node.args) > 2 else None
    if bias is not None:
        b = get_constant(gm, bias.target).detach()
        set_constant(gm, bias.target, (b.double() - shift.double()).to(b.dtype))
        return
    name = f"_qlower_bias_correction_{node.name}"
    gm.register_parameter(name, torch.nn.Parameter(-shift, requires_grad=False))
    with gm.graph.inserting_before(node):
        attr = gm.graph.get_attr(name)
    attr.meta["val"] = torch.empty_like(shift)
    args = list(node.args) + [None] * (3 - len(node.args))
    args[2] = attr
    node.args = tuple(args)
