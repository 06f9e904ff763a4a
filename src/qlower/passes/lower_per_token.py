"""LowerPerTokenLinear: a linear layer with a per-token quantized activation becomes an integer
GEMM whose accumulator is dequantized with the run-time row scale.

Preconditions: AttachQParams ran (the weight's dequantize carries QParams); the activation was
quantized per token in the Q/DQ program (quantize/per_token.py).
BEFORE:
    s = qlower.token_scale(x);  q = qlower.quantize_per_token(x, s)
    y = linear(qlower.dequantize_per_token(q, s), dequantize_per_channel(w_i8, sw, 0, axis=0), b)
AFTER:
    acc = qlower.linear(q, 128, w_i8, 0[], None)                     # int32, exact
    y   = qlower.dequantize_per_token_acc(acc, s, sw[]) (+ b)         # fp32(fp32(acc) * sw) * s
(addmm(b, x, DQ(W)) and x @ DQ(W) with a constant W are first rewritten to linear, as LowerQDQ does.)
Refusals (node left in Q/DQ form, which the reference kernels still run exactly): weight not a
constant integer tensor, weight quantized along another axis than the output channel, an int32
accumulator that could overflow (sum |w - zw| * 128 per output channel).
Postconditions: no dequantize_per_token feeds a lowered linear; the float function equals the
Q/DQ program's up to the rounding of the float GEMM it replaces (tests/test_per_token.py).
Idempotent: the AFTER form has no dequantize_per_token feeding a linear.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from .. import numerics
from ..fx import add_constant, call, constant_value
from .base import Pass, PassContext
from .lower_qdq import LowerQDQ, arg, dq_operand

aten = torch.ops.aten
qlower = torch.ops.qlower


def _run_time_input(node: Node, dequantize) -> Node | None:
    """The linear's activation operand if `dequantize` (a run-time quantization's) made it."""
    x = node.args[1] if node.target is aten.addmm.default else node.args[0] if node.args else None
    if isinstance(x, Node) and x.target is dequantize:
        return x
    return None


class RunTimeLinearLowering(Pass):
    """The walk both run-time schemes share: every linear/addmm/matmul whose activation the
    scheme's dequantize made (`run_time_input`), matmuls with a constant weight first rewritten
    to linear, each then handed to `_lower`. Subclasses: LowerPerTokenLinear, LowerDynamicLinear."""

    @staticmethod
    def run_time_input(node: Node) -> Node | None:
        raise NotImplementedError

    def _lower(self, gm: GraphModule, node: Node, ctx: PassContext) -> bool:
        raise NotImplementedError

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target not in (aten.linear.default, aten.addmm.default,
                                                                 aten.matmul.default, aten.mm.default):
                continue
            if self.run_time_input(node) is None:
                continue
            if node.target is not aten.linear.default:
                node = LowerQDQ.matmul_with_constant_as_linear(gm, node)
                if node.target is not aten.linear.default:
                    ctx.refuse(self.name, node, "second operand is not a constant quantized weight")
                    continue
            changed |= self._lower(gm, node, ctx)
        if changed:
            gm.graph.eliminate_dead_code()
        return changed


class LowerPerTokenLinear(RunTimeLinearLowering):
    name = "lower_per_token_linear"

    @staticmethod
    def run_time_input(node: Node) -> Node | None:
        return _run_time_input(node, qlower.dequantize_per_token.default)

    def _lower(self, gm: GraphModule, node: Node, ctx: PassContext) -> bool:
        xd = self.run_time_input(node)
        q, scale = xd.args
        weight = integer_weight(gm, node, ctx, self.name, -numerics.PER_TOKEN_QMIN)   # |q - 128| <= 128
        if weight is None:
            return False
        w, w_zp, w_scale = weight
        bias = arg(node, 2, "bias")
        with gm.graph.inserting_before(node):
            zp_node = add_constant(gm, w_zp, "w_zp")
            acc = call(gm, qlower.linear.default, (q, numerics.PER_TOKEN_ZERO_POINT, w, zp_node, None), like=node)
            y = call(gm, qlower.dequantize_per_token_acc.default, (acc, scale, add_constant(gm, w_scale, "w_scale")),
                     like=node)
            if bias is not None:
                y = call(gm, aten.add.Tensor, (y, bias), like=node)
        node.replace_all_uses_with(y)
        gm.graph.erase_node(node)
        ctx.rewrites["linear -> linear (per-token)"] += 1
        return True


def integer_weight(gm: GraphModule, node: Node, ctx: PassContext, pass_name: str,
                   activation_bound: int) -> tuple[Node, torch.Tensor, torch.Tensor] | None:
    """(integer weight node, int32 zero point per output channel, fp32 scale per output channel)
    of a linear whose weight is a constant quantized along its output channels, or None with
    the refusal recorded: weight not a constant integer tensor, quantized along another axis,
    or an int32 accumulator that could overflow with |activation - zero point| <= activation_bound."""
    w = dq_operand(node.args[1])
    w_int = constant_value(gm, w.q) if w is not None else None
    if w_int is None or w_int.dtype not in (torch.int8, torch.uint8):
        ctx.refuse(pass_name, node, "weight is not a constant integer tensor")
        return None
    if w.qp.per_channel and w.qp.axis != 0:
        ctx.refuse(pass_name, node, f"weight quantized along axis {w.qp.axis}, not the output-channel axis 0")
        return None
    out_ch = w_int.shape[0]
    w_zp = torch.tensor(w.qp.zero_point, dtype=torch.int32).expand(out_ch).contiguous()
    bound = (w_int.to(torch.int64) - w_zp.to(torch.int64).reshape(-1, 1)).abs().sum(1).max()
    worst = int(bound) * activation_bound
    if worst > numerics.INT32_MAX:
        ctx.refuse(pass_name, node, f"int32 accumulator could overflow (bound {worst})")
        return None
    return w.q, w_zp, torch.tensor(w.qp.scale, dtype=torch.float32).expand(out_ch).contiguous()
