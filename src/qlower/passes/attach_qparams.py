"""AttachQParams: recognise quantized_decomposed Q/DQ nodes and attach typed `QParams`.

Preconditions: a Q/DQ graph as torchao's convert_pt2e produces (per-tensor scale/zp as
    literals or constant tensors, per-channel scale/zp as constant tensors).
BEFORE:  q = quantized_decomposed.quantize_per_tensor(x, 0.02, 128, 0, 255, uint8)
AFTER:   same node, with q.meta["qlower.qparams"] = QParams((0.02,), (128,), 0, 255, uint8, None)
Postconditions: every Q/DQ node with constant parameters carries QParams (of its integer
    tensor); Q/DQ with non-constant parameters get none and a recorded refusal.
Idempotent: re-running recomputes identical metadata and reports no change.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ..fx import constant_value, is_dequantize, is_quantize
from ..meta import QPARAMS_KEY, QParams
from .base import Pass, PassContext

qd = torch.ops.quantized_decomposed
_PER_CHANNEL = {qd.quantize_per_channel.default, qd.dequantize_per_channel.default}


def _values(gm: GraphModule, arg, cast) -> tuple | None:
    if isinstance(arg, (int, float)):
        return (cast(arg),)
    t = constant_value(gm, arg)
    if t is None:
        return None
    return tuple(cast(v) for v in t.reshape(-1).tolist())


def qparams_of(gm: GraphModule, node: Node) -> QParams | None:
    """QParams described by a Q or DQ node's arguments, or None when they are not constant."""
    if not (is_quantize(node) or is_dequantize(node)):
        return None
    if node.target in _PER_CHANNEL:
        _, scale, zp, axis, qmin, qmax, dtype = node.args[:7]
    else:
        _, scale, zp, qmin, qmax, dtype = node.args[:6]
        axis = None
    scales, zps = _values(gm, scale, float), _values(gm, zp, int)
    if scales is None or zps is None:
        return None
    if axis is not None:
        rank = node.args[0].meta["val"].dim()
        axis = axis % rank
    return QParams(scales, zps, int(qmin), int(qmax), dtype, axis)


class AttachQParams(Pass):
    name = "attach_qparams"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in gm.graph.nodes:
            if not (is_quantize(node) or is_dequantize(node)):
                continue
            qp = qparams_of(gm, node)
            if qp is None:
                ctx.refuse(self.name, node, "scale / zero point are not constants")
                continue
            if node.meta.get(QPARAMS_KEY) != qp:
                node.meta[QPARAMS_KEY] = qp
                changed = True
        return changed
