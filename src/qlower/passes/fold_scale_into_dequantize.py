"""FoldScaleIntoDequantize: a multiply (or divide) by a power of two right after a dequantize
becomes part of the dequantize's scale — bit-identical, one op fewer (attention's 1/sqrt(d) for
d = 4, 16, 64, ...).

Preconditions: CanonicalizeQDQ ran (qlower.dequantize nodes carry QParams).
BEFORE:  d = qlower.dequantize(q, s, zp, axis)          y = aten.mul.Tensor(d, 0.25)
AFTER:   y = qlower.dequantize(q, s * 0.25, zp, axis)
Why exact: fp32((q - zp) * s) * 2^k == fp32((q - zp) * (s * 2^k)) because scaling by a power of
two only moves the exponent — while every value involved stays a normal fp32 number, which is
checked from the qparams (smallest nonzero magnitude s·2^k, largest (qmax - qmin)·s·2^k).
Near misses left alone: a factor that is not a power of two, a tensor factor, a dequantize with
other users (folding would add a dequantize, not remove an op).
Postconditions: values bit-identical; no power-of-two scalar multiply directly after a
single-use dequantize. Idempotent.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch.fx import GraphModule, Node

from ..fx import add_constant, call
from ..meta import QPARAMS_KEY
from .base import Pass, PassContext

aten = torch.ops.aten
qlower = torch.ops.qlower
_FP32_MIN_NORMAL, _FP32_MAX = 2.0 ** -126, float(torch.finfo(torch.float32).max)


class FoldScaleIntoDequantize(Pass):
    name = "fold_scale_into_dequantize"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            factor = _power_of_two_factor(node)
            dq = node.args[0] if factor is not None else None
            if not (isinstance(dq, Node) and dq.target is qlower.dequantize.default and len(dq.users) == 1
                    and QPARAMS_KEY in dq.meta):
                continue
            qp = dq.meta[QPARAMS_KEY]
            scaled = replace(qp, scale=tuple(s * factor for s in qp.scale))
            if not _stays_normal(scaled):
                ctx.refuse(self.name, node, "the scaled values would leave the normal fp32 range")
                continue
            with gm.graph.inserting_before(node):
                scale = add_constant(gm, scaled.scale_tensor(), "scale")
                new = call(gm, qlower.dequantize.default, (dq.args[0], scale, dq.args[2], dq.args[3]), like=node)
            new.meta[QPARAMS_KEY] = scaled
            node.replace_all_uses_with(new)
            ctx.rewrites["power-of-two scale folded into dequantize"] += 1
            changed = True
        if changed:
            gm.graph.eliminate_dead_code()
        return changed


def _power_of_two_factor(node: Node) -> float | None:
    """The factor y = x * factor for `x * 2^k` / `x / 2^k` with a Python scalar, else None."""
    if node.op != "call_function" or node.target not in (aten.mul.Tensor, aten.div.Tensor) or node.kwargs \
            or len(node.args) != 2 or not isinstance(node.args[1], (int, float)) or isinstance(node.args[1], bool):
        return None
    c = float(node.args[1])
    if c <= 0 or not math.isfinite(c) or math.frexp(c)[0] != 0.5:
        return None
    return c if node.target is aten.mul.Tensor else 1.0 / c


def _stays_normal(qp) -> bool:
    span = qp.qmax - qp.qmin
    return all(s >= _FP32_MIN_NORMAL and s * span < _FP32_MAX for s in qp.scale)
