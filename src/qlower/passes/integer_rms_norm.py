"""IntegerRMSNorm: an RMSNorm over the last dim of an 8-bit per-tensor dequantized value is
computed from an exact integer sum of squares (numerics.rms_norm_integer).

Preconditions: CanonicalizeQDQ ran (qlower.dequantize carries QParams); float constants folded.
BEFORE:  d = qlower.dequantize(q, s, zp)
         y = aten.mul(w, aten.mul(d, aten.rsqrt(aten.add(aten.mean(aten.pow(d, 2), [-1], True), eps))))
AFTER:   y = qlower.rms_norm_integer(q, s, zp, w, eps)
Why: transformers' LLaMA-family RMSNorm is written out (pow, mean, add, rsqrt, mul), and every
engine reduces the mean and computes rsqrt its own way: hf-llama's int8 program ended up to
1.4e-6 off the reference on IREE (5 float RMSNorms; 4,791-5,361 of 8,192 outputs differ). With
d = q - zp an integer, S2 = sum(d^2) is exact and x / sqrt(mean(x^2) + eps) =
N*d / sqrt(N*S2 + eps*N^2/s^2): one conversion, one add, a correctly rounded sqrt, a division and
the weight's multiply, single IEEE operations every backend reproduces bit for bit — the
LayerNorm's integer form (integer_layer_norm) without the mean. The RMSNorm block op
(qlower::rms_norm) is left alone: a block op stays one operator.
Near misses left alone: the pow and the mul reading different values, a per-channel / 16-bit /
int32 dequantize, a mean over another dim or without keepdim, an intermediate read elsewhere,
a weight that is not a 1-D fp32 constant (the normalizing mul is then the output and the weight
multiply stays float), a dynamic last dim, N > 33,025 (sum(d^2) could leave int32).
Postconditions: no written-out RMSNorm reads an 8-bit per-tensor dequantize. Idempotent.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from .. import numerics
from ..fx import call
from ..meta import QPARAMS_KEY
from ..patterns import RmsNorm, match_rms_norm
from .base import Pass, PassContext, is_eight_bit_dequantize, replace_and_drop

aten = torch.ops.aten
qlower = torch.ops.qlower


class IntegerRMSNorm(Pass):
    name = "integer_rms_norm"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target is not aten.pow.Tensor_Scalar:
                continue
            norm = match_rms_norm(node)
            if norm is None or _not_integer(norm) is not None:
                continue
            dq = norm.squared
            qp = dq.meta[QPARAMS_KEY]
            with gm.graph.inserting_before(norm.output):
                new = call(gm, qlower.rms_norm_integer.default,
                           (dq.args[0], float(qp.scale[0]), int(qp.zero_point[0]), norm.weight, norm.eps),
                           like=norm.output)
            replace_and_drop(gm, norm.output, new, list(norm.nodes[:-1]), norm.squared)
            if norm.scaled is not norm.squared and not norm.scaled.users:   # PT2E's second dequantize
                gm.graph.erase_node(norm.scaled)
            ctx.rewrites["rms_norm of an 8-bit value -> integer sum of squares"] += 1
            changed = True
        return changed


def _same_quantized_value(a: Node, b: Node) -> bool:
    """One dequantize, or two dequantizes of the same codes with the same qparams."""
    return a is b or (is_eight_bit_dequantize(b) and a.args[0] is b.args[0]
                      and a.meta[QPARAMS_KEY] == b.meta[QPARAMS_KEY])


def _not_integer(norm: RmsNorm) -> str | None:
    """Why this RMSNorm keeps its float form, or None."""
    if not is_eight_bit_dequantize(norm.squared) or not _same_quantized_value(norm.squared, norm.scaled):
        return "input is not one 8-bit per-tensor dequantize"
    n = norm.squared.meta["val"].shape[-1]
    if not isinstance(n, int):
        return "the normalized dim must be static"
    if n > numerics.LAYER_NORM_MAX_N:
        return f"N = {n} > {numerics.LAYER_NORM_MAX_N}: sum(d^2) could leave int32"
    return None
