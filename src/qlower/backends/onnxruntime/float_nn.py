"""Float convolution-network ops in ONNX: what a float CNN (or a quantized model's float
remainder: a conv whose lowering was refused, a batch norm that was not folded) needs to stay in
ONNX Runtime instead of falling back to PyTorch between clusters.

  conv1d / conv2d        -> Conv (explicit pads, strides, dilations, group)
  batch_norm (eval)      -> BatchNormalization
  hardtanh / clamp       -> Clip;  hardswish -> HardSwish;  hardsigmoid -> HardSigmoid
  max_pool2d             -> MaxPool;  avg_pool2d -> AveragePool (PyTorch's count_include_pad
                            default, divisor_override refused)

These are float kernels: agreement with PyTorch is to float rounding, not bit-exact (the tests
compare with a tolerance; the integer ops are the bit-exact contract)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch.fx import Node

from .emit import EmitError, Emitter

aten = torch.ops.aten


def _pair(v, n: int) -> list[int]:
    vals = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in (vals * n if len(vals) == 1 else vals)]


def _with_defaults(given, defaults: list) -> list:
    """Positional arguments after the given ones take the schema's defaults (export drops
    trailing arguments that equal their default)."""
    return list(given) + defaults[len(given):]


def _operand(e: Emitter, node: Node | None, default: torch.Tensor, hint: str) -> str:
    """An FX operand by name, or `default` as an initializer where PyTorch passes None."""
    return node.name if node is not None else e.const(default, hint)


def conv(e: Emitter, node: Node) -> None:
    x, w = node.args[0], node.args[1]
    bias, stride, padding, dilation, groups = _with_defaults(node.args[2:], [None, 1, 0, 1, 1])
    spatial = w.meta["val"].dim() - 2
    if isinstance(padding, str):
        raise EmitError(f"string padding {padding!r} is not emitted")
    pads = _pair(padding, spatial)
    inputs = [x.name, w.name] + ([bias.name] if bias is not None else [])
    e.op("Conv", inputs, node.name, strides=_pair(stride, spatial), pads=pads * 2,
         dilations=_pair(dilation, spatial), group=int(groups))


def batch_norm(e: Emitter, node: Node) -> None:
    x, w, b, mean, var, training = node.args[:6]
    eps = node.args[7] if len(node.args) > 7 else 1e-5
    if training:
        raise EmitError("batch_norm in training mode")
    if mean is None or var is None:
        raise EmitError("batch_norm without running statistics")
    c = x.meta["val"].shape[1]
    e.op("BatchNormalization", [x.name, _operand(e, w, torch.ones(c), "bn_w"), _operand(e, b, torch.zeros(c), "bn_b"),
                                mean.name, var.name], node.name, epsilon=float(eps))


def _clip(e: Emitter, node: Node, lo, hi) -> None:
    bounds = [e.const(np.float32(v), "bound") if v is not None else "" for v in (lo, hi)]
    while bounds and bounds[-1] == "":
        bounds.pop()
    e.op("Clip", [node.args[0].name, *bounds], node.name)


def hardtanh(e: Emitter, node: Node) -> None:
    a = list(node.args) + [-1.0, 1.0][len(node.args) - 1:]
    _clip(e, node, a[1], a[2])


def clamp(e: Emitter, node: Node) -> None:
    a = list(node.args) + [None, None]
    if isinstance(a[1], Node) or isinstance(a[2], Node):
        raise EmitError("clamp with tensor bounds is not emitted")
    _clip(e, node, a[1], a[2])


def max_pool(e: Emitter, node: Node) -> None:
    x, kernel = node.args[0], _pair(node.args[1], 2)
    stride, padding, dilation, ceil = _with_defaults(node.args[2:], [None, 0, 1, False])
    e.op("MaxPool", [x.name], node.name, kernel_shape=kernel, strides=_pair(stride, 2) if stride else kernel,
         pads=_pair(padding, 2) * 2, dilations=_pair(dilation, 2), ceil_mode=int(bool(ceil)))


def avg_pool(e: Emitter, node: Node) -> None:
    x, kernel = node.args[0], _pair(node.args[1], 2)
    stride, padding, ceil, include_pad, divisor = _with_defaults(node.args[2:], [None, 0, False, True, None])
    if divisor is not None:
        raise EmitError("avg_pool2d with divisor_override is not emitted")
    e.op("AveragePool", [x.name], node.name, kernel_shape=kernel, strides=_pair(stride, 2) if stride else kernel,
         pads=_pair(padding, 2) * 2, ceil_mode=int(bool(ceil)), count_include_pad=int(bool(include_pad)))


FLOAT_NN: dict[object, Callable[[Emitter, Node], None]] = {
    aten.conv1d.default: conv,
    aten.conv2d.default: conv,
    aten.batch_norm.default: batch_norm,
    aten.hardtanh.default: hardtanh,
    aten.clamp.default: clamp,
    aten.hardswish.default: lambda e, n: e.op("HardSwish", [n.args[0].name], n.name),
    aten.hardsigmoid.default: lambda e, n: e.op("HardSigmoid", [n.args[0].name], n.name, alpha=1 / 6, beta=0.5),
    aten.max_pool2d.default: max_pool,
    aten.avg_pool2d.default: avg_pool,
}
