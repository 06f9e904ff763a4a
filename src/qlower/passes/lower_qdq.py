"""LowerQDQ (simplify_qdq): rewrite DQ -> op (-> activation) -> Q into qlower integer ops.

Preconditions: AttachQParams ran (Q/DQ nodes carry QParams).
BEFORE:
    xd = dequantize_per_tensor(xq, sx, zx)      wd = dequantize_per_channel(w_i8, sw[], 0, axis=0)
    bd = dequantize_per_channel(b_i32, sx*sw[])  y = conv2d(xd, wd, bd, ...)   r = relu(y)
    yq = quantize_per_tensor(r, sy, zy)
AFTER:
    acc = qlower.conv2d(xq, zx, w_i8, 0[], b_i32, ...)                       # int32
    yq  = qlower.requantize(acc, fp32(sx*sw)[], sy, zy, max(qmin, zy), qmax, axis=1, profile)
Also: DQ -> op with no trailing Q becomes qlower op + qlower.dequantize of the accumulator;
DQ(a), DQ(b) -> add/mul (-> relu) -> Q becomes qlower.add/mul; range-preserving ops whose
input and output qparams are identical (max-pool, relu/hardtanh, reshape family, concat) run on
the integers directly.
Refusals (node left in float, reason recorded): possible int32 overflow (bound computed from K,
the actual weight values and the activation range), per-channel weight axis other than the
output-channel axis, non-constant weights/scales/bias, per-channel matmul operands, non-default
op overloads.
Errors: under the "fixed" profile, a requantization scale TOSA's RESCALE cannot express (>= 2^29)
is a NumericsError naming the op (no profile-"fixed" program could run it).
Postconditions: integer ops carry QParams of what they produce; the graph computes the same
function up to the canonical-numerics differences listed in docs/numerics.md.
Idempotent: a second run finds no DQ-fed anchors left and changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node

from .. import numerics
from ..errors import NumericsError
from ..fx import add_constant, call, constant_value, is_dequantize, is_quantize, schema_name, source_of
from ..meta import QPARAMS_KEY, QParams
from .base import Pass, PassContext
from .dq_through_shape import dequantize_node

aten = torch.ops.aten
qlower = torch.ops.qlower

ACCUMULATING = {aten.mm.default: qlower.matmul.default, aten.conv1d.default: qlower.conv1d.default,
                aten.conv2d.default: qlower.conv2d.default,
                aten.linear.default: qlower.linear.default, aten.matmul.default: qlower.matmul.default,
                aten.bmm.default: qlower.matmul.default}
BINARY = {aten.add.Tensor: qlower.add.default, aten.mul.Tensor: qlower.mul.default}
ACTIVATIONS = {aten.relu.default, aten.relu_.default, aten.hardtanh.default, aten.hardtanh_.default,
               aten.clamp.default}
SHAPE_PASSTHROUGH = {aten.reshape.default, aten.view.default, aten.flatten.using_ints,
                     aten.permute.default, aten.transpose.int, aten.squeeze.dim,
                     aten.unsqueeze.default, aten.contiguous.default, aten.slice.Tensor,
                     aten.select.int}



class _NotLowered(Exception):
    """Raised by a pass-through builder for an argument combination with no integer form."""


@dataclass(frozen=True)
class Operand:
    """An integer tensor feeding a float op through a dequantize."""
    q: Node
    qp: QParams


def dq_operand(node) -> Operand | None:
    if is_dequantize(node) and QPARAMS_KEY in node.meta:
        return Operand(node.args[0], node.meta[QPARAMS_KEY])
    return None


def arg(node: Node, index: int, name: str, default=None):
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def activation_range(act: Node | None, out: QParams) -> tuple[int, int]:
    """Integer [lo, hi] of the output after fusing `act` into requantization."""
    s, zp = out.scale[0], out.zero_point[0]
    if act is None:
        return out.qmin, out.qmax
    if act.target in (aten.relu.default, aten.relu_.default):
        return numerics.clamp_range_for_activation("relu", s, zp, out.qmin, out.qmax)
    if act.target in (aten.hardtanh.default, aten.hardtanh_.default):
        lo, hi = arg(act, 1, "min_val", -1.0), arg(act, 2, "max_val", 1.0)
    else:
        lo, hi = arg(act, 1, "min"), arg(act, 2, "max")
    return numerics.clamp_range_for_activation("clamp", s, zp, out.qmin, out.qmax, lo, hi)


def output_chain(anchor: Node) -> tuple[Node | None, Node | None]:
    """(fused activation, quantize) following `anchor`, or (None, None) when the output is not
    requantized per-tensor right after an optional single activation."""
    users, act = list(anchor.users), None
    if len(users) == 1 and users[0].target in ACTIVATIONS:
        act = users[0]
        users = list(act.users)
    if len(users) == 1 and is_quantize(users[0]):
        qp = users[0].meta.get(QPARAMS_KEY)
        if qp is not None and not qp.per_channel:
            return act, users[0]
    return None, None


def fixed_multipliers(node: Node, acc_scale: torch.Tensor, out_scale: float) -> None:
    """Under the "fixed" profile every channel's requantization needs a TOSA multiplier: a scale
    it cannot express (>= 2^29: huge weights into a narrow output range) is refused here, at
    compile time and naming the op, not by the first call."""
    for s in acc_scale.reshape(-1).tolist():
        try:
            numerics.fixed_multiplier(numerics.fixed_scale(s, out_scale))
        except NumericsError as e:
            raise NumericsError(e.cause, hint=e.hint, node=node.name, schema=schema_name(node),
                                source=source_of(node)) from None


def max_abs_centered(qp: QParams) -> int:
    """max |q - zp| over the representable range of a per-tensor operand."""
    zp = qp.zero_point[0]
    return max(zp - qp.qmin, qp.qmax - zp)


class LowerQDQ(Pass):
    name = "lower_qdq"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.graph is not gm.graph:
                continue
            if node.target in (aten.matmul.default, aten.mm.default, aten.addmm.default):
                node = self.matmul_with_constant_as_linear(gm, node)
            if node.target in ACCUMULATING:
                changed |= self._lower_accumulating(gm, node, ctx)
            elif node.target in BINARY:
                changed |= self._lower_binary(gm, node, ctx)
            elif node.target in SHAPE_PASSTHROUGH or node.target in ACTIVATIONS or \
                    node.target in (aten.max_pool2d.default, aten.cat.default, aten.adaptive_avg_pool2d.default,
                                    aten.mean.dim):
                changed |= self._lower_passthrough(gm, node, ctx)
        if changed:
            gm.graph.eliminate_dead_code()
        return changed

    # ------------------------------------------------------------------ conv/linear/matmul
    @staticmethod
    def matmul_with_constant_as_linear(gm: GraphModule, node: Node) -> Node:
        """x @ DQ(B) (or addmm(bias, x, DQ(B))) with B a constant 2-D integer tensor quantized
        per-tensor or per output column is linear(x, DQ(B.T)[, bias]) with the channel on axis 0:
        one lowering path for all three."""
        is_addmm = node.target is aten.addmm.default
        if is_addmm and (node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1):
            return node
        x_arg, b_arg = (node.args[1], node.args[2]) if is_addmm else (node.args[0], node.args[1])
        b = dq_operand(b_arg)
        b_int = constant_value(gm, b.q) if b is not None else None
        if b_int is None or b_int.dim() != 2 or (b.qp.per_channel and b.qp.axis != 1):
            return node
        qp = QParams(b.qp.scale, b.qp.zero_point, b.qp.qmin, b.qp.qmax, b.qp.dtype, 0 if b.qp.per_channel else None)
        with gm.graph.inserting_before(node):
            w = add_constant(gm, b_int.t().contiguous(), "w_t")
            extra = (node.args[0],) if is_addmm else ()
            linear = call(gm, aten.linear.default, (x_arg, dequantize_node(gm, w, qp, like=node), *extra), like=node)
        node.replace_all_uses_with(linear)
        gm.graph.erase_node(node)
        return linear

    def _lower_accumulating(self, gm: GraphModule, node: Node, ctx: PassContext) -> bool:
        x = dq_operand(node.args[0])
        if x is None:
            return False
        if x.qp.per_channel:
            ctx.refuse(self.name, node, "activation is quantized per-channel")
            return False
        is_matmul = ACCUMULATING[node.target] is qlower.matmul.default
        plan = self._plan_matmul(gm, node, x, ctx) if is_matmul else self._plan_weighted(gm, node, x, ctx)
        if plan is None:
            return False
        args, acc_scale, acc_axis = plan
        act, q = output_chain(node)
        with gm.graph.inserting_before(node):
            acc = call(gm, ACCUMULATING[node.target], args, like=node)
            n_scale = len(acc_scale)
            acc.meta[QPARAMS_KEY] = QParams(tuple(acc_scale.tolist()), (0,) * n_scale,
                                            numerics.INT32_MIN, numerics.INT32_MAX, torch.int32,
                                            acc_axis if n_scale > 1 else None)
            scale_node = add_constant(gm, acc_scale, "acc_scale")
            axis = acc_axis if n_scale > 1 else None
            if q is not None:
                out = q.meta[QPARAMS_KEY]
                if ctx.profile == "fixed":
                    fixed_multipliers(node, acc_scale, out.scale[0])
                lo, hi = activation_range(act, out)
                y = call(gm, qlower.requantize.default,
                         (acc, scale_node, out.scale[0], out.zero_point[0], lo, hi, out.dtype, axis,
                          ctx.profile), like=node)
                y.meta[QPARAMS_KEY] = out
                q.replace_all_uses_with(y)
            else:
                zeros = add_constant(gm, torch.zeros(n_scale, dtype=torch.int32), "zero")
                y = call(gm, qlower.dequantize.default, (acc, scale_node, zeros, axis), like=node)
                node.replace_all_uses_with(y)
        ctx.rewrites[f"{node.target.__name__} -> {ACCUMULATING[node.target].__name__}"] += 1
        return True

    def _plan_weighted(self, gm, node, x: Operand, ctx):
        w_dq = node.args[1]
        w = dq_operand(w_dq)
        if w is None:
            ctx.refuse(self.name, node, "weight is not dequantized from an integer tensor")
            return None
        w_int = constant_value(gm, w.q)
        if w_int is None:
            ctx.refuse(self.name, node, "weight is not a constant")
            return None
        if w.qp.per_channel and w.qp.axis != 0:
            ctx.refuse(self.name, node, f"weight quantized along axis {w.qp.axis}, not the "
                                        "output-channel axis 0")
            return None
        out_ch = w_int.shape[0]
        w_zp = torch.tensor(w.qp.zero_point, dtype=torch.int32).expand(out_ch).contiguous() \
            if not w.qp.per_channel else torch.tensor(w.qp.zero_point, dtype=torch.int32)
        acc_scale = numerics.accumulator_scale(x.qp.scale[0], torch.tensor(w.qp.scale)).reshape(-1)
        bias = self._integer_bias(gm, node, arg(node, 2, "bias"), acc_scale, ctx)
        if bias is False:
            return None
        # Overflow proof: per output channel, sum |w - zw| * max|x - zx| + |bias| < 2^31.
        centered = (w_int.to(torch.int64) - w_zp.to(torch.int64).reshape(-1, *[1] * (w_int.dim() - 1)))
        per_channel = centered.abs().reshape(out_ch, -1).sum(1) * max_abs_centered(x.qp)
        if bias is not None:
            per_channel = per_channel + bias.to(torch.int64).abs()
        if int(per_channel.max()) > numerics.INT32_MAX:
            ctx.refuse(self.name, node, f"int32 accumulator could overflow (bound {int(per_channel.max())})")
            return None
        with gm.graph.inserting_before(node):
            zp_node = add_constant(gm, w_zp, "w_zp")
            bias_node = add_constant(gm, bias, "bias_i32") if bias is not None else None
        zx = x.qp.zero_point[0]
        if node.target is aten.linear.default:
            return (x.q, zx, w.q, zp_node, bias_node), acc_scale, node.meta["val"].dim() - 1
        if isinstance(arg(node, 4, "padding", 0), str):
            ctx.refuse(self.name, node, "string padding ('same'/'valid') is not lowered")
            return None
        nd = 1 if node.target is aten.conv1d.default else 2
        listify = lambda v: list(v) if isinstance(v, (list, tuple)) else [v] * nd
        conv_args = (listify(arg(node, 3, "stride", 1)), listify(arg(node, 4, "padding", 0)),
                     listify(arg(node, 5, "dilation", 1)), arg(node, 6, "groups", 1))
        return (x.q, zx, w.q, zp_node, bias_node, *conv_args), acc_scale, 1

    def _integer_bias(self, gm, node, bias, acc_scale, ctx):
        """int32 bias at scale acc_scale; None when absent; False (refused) when not constant."""
        if bias is None:
            return None
        b = dq_operand(bias)
        if b is not None:
            b_int = constant_value(gm, b.q)
            if b_int is not None and b.qp.dtype == torch.int32 and \
                    torch.equal(torch.tensor(b.qp.scale, dtype=torch.float32).expand_as(acc_scale), acc_scale) \
                    and not any(b.qp.zero_point):
                return b_int.to(torch.int32)
            if b_int is not None:
                return numerics.quantize_bias(numerics.dequantize(b_int, b.qp.scale_tensor(),
                                                                  b.qp.zero_point_tensor(), b.qp.axis), acc_scale)
        b_float = constant_value(gm, bias)
        if b_float is not None and b_float.dtype.is_floating_point:
            return numerics.quantize_bias(b_float, acc_scale)
        ctx.refuse(self.name, node, "bias is not a constant")
        return False

    def _plan_matmul(self, gm, node, a: Operand, ctx):
        b = dq_operand(node.args[1])
        if b is None:
            ctx.refuse(self.name, node, "second operand is not dequantized from an integer tensor")
            return None
        if b.qp.per_channel:
            ctx.refuse(self.name, node, "per-channel matmul operands are not lowered")
            return None
        k = node.args[0].meta["val"].shape[-1]
        if not isinstance(k, int):
            # a bound from the Dim's declared max would prove it, but the
            # integer matmul then splits OpenVINO's cluster (it runs no int8 x int8 MatMulInteger)
            # and the size crossing the split makes the whole int8 transformer fall back there
            ctx.refuse(self.name, node, "reduction dimension is dynamic; overflow bound unprovable")
            return None
        bound = k * max_abs_centered(a.qp) * max_abs_centered(b.qp)
        if bound > numerics.INT32_MAX:
            ctx.refuse(self.name, node, f"int32 accumulator could overflow (bound {bound})")
            return None
        acc_scale = numerics.accumulator_scale(a.qp.scale[0], b.qp.scale[0]).reshape(1)
        return (a.q, a.qp.zero_point[0], b.q, b.qp.zero_point[0]), acc_scale, None

    # ------------------------------------------------------------------ add / mul
    def _lower_binary(self, gm: GraphModule, node: Node, ctx: PassContext) -> bool:
        a, b = dq_operand(node.args[0]), dq_operand(node.args[1]) if len(node.args) > 1 else None
        if a is None or b is None:
            return False
        if node.kwargs.get("alpha", 1) != 1:
            ctx.refuse(self.name, node, "add with alpha != 1 is not lowered")
            return False
        if a.qp.per_channel or b.qp.per_channel:
            ctx.refuse(self.name, node, "per-channel operands of add/mul are not lowered")
            return False
        act, q = output_chain(node)
        if q is None:
            return False
        out = q.meta[QPARAMS_KEY]
        lo, hi = activation_range(act, out)
        with gm.graph.inserting_before(node):
            y = call(gm, BINARY[node.target], (a.q, a.qp.scale[0], a.qp.zero_point[0], b.q, b.qp.scale[0],
                                               b.qp.zero_point[0], out.scale[0], out.zero_point[0], lo, hi,
                                               out.dtype), like=node)
        y.meta[QPARAMS_KEY] = out
        q.replace_all_uses_with(y)
        ctx.rewrites[f"{node.target.__name__} -> {BINARY[node.target].__name__}"] += 1
        return True

    # ------------------------------------------------------------------ pass-through
    def _lower_passthrough(self, gm: GraphModule, node: Node, ctx: PassContext) -> bool:
        inputs = node.args[0] if node.target is aten.cat.default else [node.args[0]]
        operands = [dq_operand(i) for i in inputs]
        if not operands or any(o is None for o in operands):
            return False
        users = list(node.users)
        if len(users) != 1 or not is_quantize(users[0]) or QPARAMS_KEY not in users[0].meta:
            return False
        q, qp = users[0], operands[0].qp
        if any(o.qp != qp for o in operands) or q.meta[QPARAMS_KEY] != qp or qp.per_channel:
            ctx.refuse(self.name, node, "input and output qparams differ; not a pass-through")
            return False
        try:
            with gm.graph.inserting_before(node):
                y = self._integer_passthrough(gm, node, [o.q for o in operands], qp)
        except _NotLowered as why:
            ctx.refuse(self.name, node, str(why))
            return False
        y.meta[QPARAMS_KEY] = qp
        q.replace_all_uses_with(y)
        ctx.rewrites[f"{node.target.__name__} -> integer"] += 1
        return True

    def _integer_passthrough(self, gm, node, qs, qp: QParams) -> Node:
        t = node.target
        if t is aten.cat.default:
            return call(gm, t, (qs, arg(node, 1, "dim", 0)), like=node)
        if t is aten.adaptive_avg_pool2d.default:
            if list(node.args[1]) not in ([1, 1], [1]):
                raise _NotLowered("only global average pooling has an integer form")
            return call(gm, qlower.mean.default, (qs[0], qp.zero_point[0], [-2, -1], True, qp.qmin, qp.qmax), like=node)
        if t is aten.mean.dim:
            keep = arg(node, 2, "keepdim", False)
            return call(gm, qlower.mean.default, (qs[0], qp.zero_point[0], list(node.args[1]), bool(keep), qp.qmin,
                                                  qp.qmax), like=node)
        if t is aten.max_pool2d.default:
            two = lambda v: list(v) if isinstance(v, (list, tuple)) else [v, v]
            return call(gm, qlower.max_pool2d.default,
                        (qs[0], two(node.args[1]),
                         two(arg(node, 2, "stride", [])) if arg(node, 2, "stride", []) else [],
                         two(arg(node, 3, "padding", 0)), two(arg(node, 4, "dilation", 1)),
                         bool(arg(node, 5, "ceil_mode", False))), like=node)
        if t in ACTIVATIONS:
            lo, hi = activation_range(node, qp)
            return call(gm, aten.clamp.default, (qs[0], lo, hi), like=node)
        return call(gm, t, (qs[0], *node.args[1:]), node.kwargs, like=node)
