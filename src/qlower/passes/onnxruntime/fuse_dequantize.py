"""FuseDequantize (onnxruntime legalization): an integer linear whose only user dequantizes its
int32 accumulator to fp32 (a linear with a float output: the `transformer-static` preset's
linears, a classifier head) becomes one `qlower_ort::linear_dequant` node, translated to ONE
ONNX Runtime kernel instead of MatMulInteger -> Add(bias) -> Cast -> Mul(s_acc): com.microsoft
QGemm with no output scale (float output; on a 2-D view of the input) where there is a bias,
com.microsoft MatMulIntegerToFloat (any rank) where there is none.

Why exact: both kernels run the same MLAS GEMM on the same weight formulation as MatMulInteger
(`lowering/integer.py: _weights`, s8 or u8 per CPU), add QGemm's int32 bias C to the int32
accumulator, and multiply fp32(acc) by fp32(A_scale * B_scale) = fp32(1 * s_acc) = s_acc per
column in their epilogue: fp32(fp32(acc + bias) * s_acc), numerics.dequantize of the
accumulator. Measured before relying on it (ONNX Runtime 1.31): bit-identical to the unfused
form for biases up to +-3e8 and 1..300 rows, s8 and u8 weights. Three passes over every
linear's output fewer (zoo decoder, `transformer-static`: 104 -> 95 ONNX Runtime nodes).

Preconditions: LowerQDQ ran; constants are get_attr nodes.
BEFORE:  acc = qlower.linear(x_u8, zx, w, zw, b_i32)   y = qlower.dequantize(acc, s_acc, 0, -1)
AFTER:   y = qlower_ort.linear_dequant(x_u8, zx, w, zw, b_i32, s_acc, 0, -1)
Near misses left alone: an accumulator with a second user, int8 activations, a non-constant
weight, weight zero point or accumulator scale, per-channel weight zero points, a nonzero
accumulator zero point, a scale along another axis than the output features.
Postconditions: values bit-identical (the fused op's reference kernel is the composition).
Idempotent: the fused node is not a qlower.linear, so a second run finds nothing.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ...fx import call, constant_value, full_args, tensor_dtype
from ..base import Pass, PassContext
from ...ops import fused as fused_ops  # noqa: F401  (registers qlower_ort ops)

q = torch.ops.qlower
ort = torch.ops.qlower_ort


def _fusable(gm: GraphModule, acc: Node, dq: Node) -> bool:
    if not isinstance(acc, Node) or acc.target is not q.linear.default or len(acc.users) != 1:
        return False
    x, _x_zp, w, w_zp, _bias = full_args(acc)
    _, acc_scale, acc_zp, axis = full_args(dq)
    w_zp_v, scale, zp = (constant_value(gm, v) for v in (w_zp, acc_scale, acc_zp))
    if tensor_dtype(x) != torch.uint8 or constant_value(gm, w) is None or w_zp_v is None or scale is None or zp is None:
        return False
    rank = acc.meta["val"].dim()
    per_feature = scale.numel() == 1 or (axis is not None and axis % rank == rank - 1)
    return per_feature and w_zp_v.unique().numel() == 1 and not bool(zp.any())


class FuseDequantize(Pass):
    name = "fuse_dequantize"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for dq in list(gm.graph.nodes):
            if dq.op != "call_function" or dq.target is not q.dequantize.default:
                continue
            acc = dq.args[0]
            if not _fusable(gm, acc, dq):
                continue
            with gm.graph.inserting_before(dq):
                fused = call(gm, ort.linear_dequant.default, [*full_args(acc), *full_args(dq)[1:]], like=dq)
            dq.replace_all_uses_with(fused)
            gm.graph.erase_node(dq)
            gm.graph.erase_node(acc)
            ctx.rewrites["linear + dequantize -> linear_dequant"] += 1
            changed = True
        return changed
