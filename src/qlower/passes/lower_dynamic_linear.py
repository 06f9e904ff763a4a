"""LowerDynamicLinear: a linear layer whose input is quantized per tensor at run time becomes one
integer GEMM with its float epilogue, `qlower.linear_dynamic`.

Preconditions: AttachQParams ran (the weight's dequantize carries QParams); the activation was
quantized dynamically in the Q/DQ program (quantize/per_token.py, QuantConfig.activations="dynamic").
BEFORE:
    q, s, zp = qlower.quantize_dynamic(x)
    y = linear(qlower.dequantize_dynamic(q, s, zp), dequantize_per_channel(w_i8, sw, 0, axis=0), b)
AFTER:
    y = qlower.linear_dynamic(q, s, zp, w_i8, 0[], sw[], b)   # fp32(fp32(acc) * fp32(s * sw)) + b
(addmm(b, x, DQ(W)) and x @ DQ(W) with a constant W are first rewritten to linear, as LowerQDQ does.)
On ONNX Runtime the pair quantize_dynamic -> linear_dynamic is DynamicQuantizeLinear ->
MatMulIntegerToFloat, which the session fuses into one DynamicQuantizeMatMul: ORT's own
`quantize_dynamic` model, node for node.
Refusals (node left in Q/DQ form, which the reference kernels still run exactly): those of
LowerPerTokenLinear (weight not a constant integer tensor, quantized along another axis than
the output channel, an int32 accumulator that could overflow: sum |w - zw| * 255 per channel).
Postconditions: no dequantize_dynamic feeds a lowered linear; the float function equals the Q/DQ
program's up to the rounding of the float GEMM it replaces (tests/test_dynamic_quant.py).
Idempotent: the AFTER form has no dequantize_dynamic feeding a linear.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from .. import numerics
from ..fx import add_constant, call
from .base import PassContext
from .lower_per_token import RunTimeLinearLowering, _run_time_input, integer_weight
from .lower_qdq import arg

qlower = torch.ops.qlower


class LowerDynamicLinear(RunTimeLinearLowering):
    name = "lower_dynamic_linear"

    @staticmethod
    def run_time_input(node: Node) -> Node | None:
        return _run_time_input(node, qlower.dequantize_dynamic.default)

    def _lower(self, gm: GraphModule, node: Node, ctx: PassContext) -> bool:
        q, scale, zero_point = self.run_time_input(node).args
        weight = integer_weight(gm, node, ctx, self.name, numerics.DYNAMIC_QMAX)   # |q - zp| <= 255
        if weight is None:
            return False
        w, w_zp, w_scale = weight
        with gm.graph.inserting_before(node):
            y = call(gm, qlower.linear_dynamic.default,
                     (q, scale, zero_point, w, add_constant(gm, w_zp, "w_zp"), add_constant(gm, w_scale, "w_scale"),
                      arg(node, 2, "bias")), like=node)
        node.replace_all_uses_with(y)
        gm.graph.erase_node(node)
        ctx.rewrites["linear -> linear_dynamic"] += 1
        return True
