"""IntegerLayerNorm: a LayerNorm over the last dim of an 8-bit per-tensor dequantized value is
computed from exact integer statistics (numerics.layer_norm_integer).

Preconditions: CanonicalizeQDQ ran (qlower.dequantize carries QParams).
BEFORE:  d = qlower.dequantize(q, s, zp)      y = aten.layer_norm(d, [N], w, b, eps)
AFTER:   y = qlower.layer_norm_integer(q, s, zp, w, b, eps)
Why: the float LayerNorm's mean and variance are sums that each engine's kernel reduces in its
own order with its own sqrt (measured, AMD EPYC: PyTorch's fp32 sqrt is not correctly rounded on
202,029 of 2^20 inputs), so its output differs from the reference by float rounding on every
engine (the zoo transformer int8 ends 4.8e-7 off on IREE). With q - zp integers, sum(d) and
sum(d^2) are exact, mean and variance follow exactly as N*d - S1 and N*S2 - S1^2, and what is
left — one conversion, one add, a correctly rounded sqrt, a division, the affine — is a fixed
sequence of single IEEE operations that every backend reproduces bit for bit. The math is the
float LayerNorm's: (x - mean)/sqrt(var + eps) = t / sqrt(V + eps*N^2/s^2) with x = s*d.
The LayerNorm block op (qlower::layer_norm) is left alone: a block op stays one operator that
maps to one backend kernel (ONNX Runtime's LayerNormalization).
Near misses left alone: a per-channel or 16-bit or int32 dequantize, a LayerNorm over more than
the last dim, N > 33,025 (sum(d^2) could leave int32), a weight or bias that is not a constant
(or absent), a dynamic last dim.
Postconditions: no layer_norm reads an 8-bit per-tensor dequantize directly. Idempotent.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from .. import numerics
from ..fx import call, full_args
from ..meta import QPARAMS_KEY
from .base import Pass, PassContext, is_eight_bit_dequantize, replace_and_drop

aten = torch.ops.aten
qlower = torch.ops.qlower


class IntegerLayerNorm(Pass):
    name = "integer_layer_norm"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target is not aten.layer_norm.default:
                continue
            args = full_args(node)
            dq = args[0]
            if _not_integer(dq, args) is not None:
                continue
            qp = dq.meta[QPARAMS_KEY]
            with gm.graph.inserting_before(node):
                new = call(gm, qlower.layer_norm_integer.default,
                           (dq.args[0], float(qp.scale[0]), int(qp.zero_point[0]), args[2], args[3], float(args[4])),
                           like=node)
            replace_and_drop(gm, node, new, [], dq)
            ctx.rewrites["layer_norm of an 8-bit value -> integer statistics"] += 1
            changed = True
        return changed


def _not_integer(dq, args) -> str | None:
    """Why this LayerNorm keeps its float form, or None."""
    if not is_eight_bit_dequantize(dq):
        return "input is not an 8-bit per-tensor dequantize"
    shape = dq.meta["val"].shape
    normalized = list(args[1])
    if len(normalized) != 1 or not isinstance(shape[-1], int) or normalized[0] != shape[-1]:
        return "not over the (static) last dim alone"
    if shape[-1] > numerics.LAYER_NORM_MAX_N:
        return f"N = {shape[-1]} > {numerics.LAYER_NORM_MAX_N}: sum(d^2) could leave int32"
    for affine in args[2:4]:
        if affine is not None and not (isinstance(affine, Node) and affine.op == "get_attr"
                                       and affine.meta["val"].dtype == torch.float32):
            return "weight and bias must be fp32 constants"
    return None
