"""FusePerTokenLinear (onnxruntime legalization): a per-token linear's integer GEMM and the
dequantization of its accumulator become one `qlower_ort::linear_per_token` node, translated to
one com.microsoft MatMulIntegerToFloat (B_scale = s_w per column, A_scale = the token scale per
row; lowering/integer.py: linear_per_token).

Why exact: MatMulIntegerToFloat computes the same int32 accumulator as MatMulInteger (same MLAS
GEMM, same per-CPU weight formulation) and multiplies it, converted to fp32, by fp32(1 * s_w) =
s_w per output column in its epilogue: fp32(fp32(acc) * s_w), the first rounding of
numerics.dequantize_per_token_accumulator; its multiply of the output by a per-row A_scale is
the second. Measured: the unfused
form (MatMulInteger, Cast, Mul, Mul) cost two extra passes over every linear's output.

Preconditions: LowerPerTokenLinear ran; constants are get_attr nodes.
BEFORE:  acc = qlower.linear(q_u8, 128, w, zw, None)   y = qlower.dequantize_per_token_acc(acc, s, sw)
AFTER:   y = qlower_ort.linear_per_token(q_u8, 128, w, zw, s, sw)
Near misses left alone: an accumulator with a second user, a linear with a bias inside (the
per-token pass adds bias after), a non-constant weight, weight zero point or weight scale.
Postconditions: values bit-identical (the fused op's reference kernel is the composition).
Idempotent: the fused node is not a qlower.linear, so a second run finds nothing.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ...fx import call, constant_value, full_args
from ..base import Pass, PassContext
from ...ops import fused as fused_ops  # noqa: F401  (registers qlower_ort ops)

q = torch.ops.qlower
ort = torch.ops.qlower_ort


def _fusable(gm: GraphModule, acc: Node, w_scale) -> bool:
    if not isinstance(acc, Node) or acc.target is not q.linear.default or len(acc.users) != 1:
        return False
    x, _x_zp, w, w_zp, bias = full_args(acc)
    return bias is None and all(constant_value(gm, v) is not None for v in (w, w_zp, w_scale))


class FusePerTokenLinear(Pass):
    name = "fuse_per_token_linear"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target is not q.dequantize_per_token_acc.default:
                continue
            acc, token_scale, w_scale = node.args
            if not _fusable(gm, acc, w_scale):
                continue
            x, x_zp, w, w_zp, _ = full_args(acc)
            with gm.graph.inserting_before(node):
                fused = call(gm, ort.linear_per_token.default, (x, x_zp, w, w_zp, token_scale, w_scale), like=node)
            node.replace_all_uses_with(fused)
            gm.graph.erase_node(node)
            gm.graph.erase_node(acc)
            ctx.rewrites["linear + dequantize_per_token_acc -> linear_per_token"] += 1
            changed = True
        return changed
