"""FuseRequantize (onnxruntime legalization): an integer conv / linear / matmul whose only user is
a `float`-profile requantize becomes one `qlower_ort::*_requant` node, where ONNX Runtime's fused
kernel computes exactly the canonical numerics on this CPU.

Why exact: the fused kernels (QLinearConv, QGemm, QLinearMatMul) are emitted with X_scale = 1
and W_scale = s_acc, so ONNX Runtime's multiplier fp32(X_scale * W_scale) / Y_scale is exactly
the canonical fp32(s_acc / sy); u8 x s8 products are exact with VNNI or 7-bit weights
(`cpu.s8_weights_exact`; without either, AVX2's 16-bit pair sums saturate). The tests compare
every element against the reference backend on both formulations.

Preconditions: LowerQDQ ran; constants are get_attr nodes.
BEFORE:  acc = qlower.conv2d(x_u8, zx, w_s8, zw=0, b, ...)   y = qlower.requantize(acc, s_acc, sy, zy, lo, hi, u8, 1)
AFTER:   y = qlower_ort.conv_requant(x_u8, zx, w_s8, zw, b, ..., s_acc, sy, zy, lo, hi, u8, 1)
Near misses left alone: int8 activations or output, 8-bit weights on a CPU without VNNI,
nonzero or per-channel weight zero points, an accumulator with a second user, the `fixed`
profile, a non-constant weight or scale, a per-channel scale on an activation matmul.
Postconditions: values bit-identical (each fused op's reference kernel is the composition).
Idempotent: fused nodes are not accumulating ops, so a second run finds nothing.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ...fx import call, constant_value, full_args, tensor_dtype
from ..base import Pass, PassContext
from ...ops import fused as fused_ops  # noqa: F401  (registers qlower_ort ops)
from ...core.cpu import s8_weights_exact

q = torch.ops.qlower
ort = torch.ops.qlower_ort


def _weights_fuse(gm: GraphModule, w, w_zp) -> bool:
    """Constant s8 weights that are exact in u8 x s8 kernels here, with zero point 0."""
    wv, zpv = constant_value(gm, w), constant_value(gm, w_zp)
    if wv is None or zpv is None or wv.dtype != torch.int8 or wv.numel() == 0:
        return False
    return bool((zpv == 0).all()) and s8_weights_exact(int(wv.min()), int(wv.max()))


def fused_target(gm: GraphModule, producer: Node, rq_args: list):
    """The qlower_ort op for producer -> requantize, or None where the fused kernel is not exact."""
    acc_scale, dtype, profile = constant_value(gm, rq_args[1]), rq_args[6], rq_args[8]
    if profile != "float" or acc_scale is None or dtype != torch.uint8:
        return None
    args = full_args(producer)
    if tensor_dtype(args[0]) != torch.uint8:
        return None
    if producer.target in (q.conv2d.default, q.conv1d.default):
        return ort.conv_requant.default if _weights_fuse(gm, args[2], args[3]) else None
    if producer.target is q.linear.default:
        return ort.linear_requant.default if _weights_fuse(gm, args[2], args[3]) else None
    if producer.target is q.matmul.default:
        uint8_b = tensor_dtype(args[2]) == torch.uint8
        return ort.matmul_requant.default if uint8_b and acc_scale.numel() == 1 else None
    return None


class FuseRequantize(Pass):
    name = "fuse_requantize"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for rq in list(gm.graph.nodes):
            if rq.op != "call_function" or rq.target is not q.requantize.default:
                continue
            producer = rq.args[0]
            if not isinstance(producer, Node) or len(producer.users) != 1:
                continue
            rq_args = full_args(rq)
            target = fused_target(gm, producer, rq_args)
            if target is None:
                continue
            with gm.graph.inserting_before(rq):
                fused = call(gm, target, [*full_args(producer), *rq_args[1:8]], like=rq)
            rq.replace_all_uses_with(fused)
            gm.graph.erase_node(rq)
            gm.graph.erase_node(producer)
            ctx.rewrites[f"{producer.target.__name__.split('.')[0]} + requantize -> {target.__name__}"] += 1
            changed = True
        return changed
