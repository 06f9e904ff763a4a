"""SeparateFloatProducts (iree legalization): a float product that a float add or subtract reads
goes through `clamp_min(p, -inf)` — the identity on every fp32 value, NaN included — so that
IREE cannot contract the multiply and the add into one fused multiply-add.

Why: IREE's CPU code generation contracts `a*b + c` into an FMA (one rounding where PyTorch and
the other engines round twice): `a*b + c*d` on 2^16 random fp32 inputs gave 16,040 results off
the reference in the last bit (AMD EPYC Zen 3, IREE 3.13); LLaMA's rotary embedding
`q*cos + rotate_half(q)*sin` between an 8-bit dequantize and a quantize flipped 5 of 5.2 million
int8 codes. A max with -inf stands between them (0 of 2^16 differ, both measurements) and costs
one compare per element inside the fused dispatch. `x + (-0.0)` does not (LLVM drops it).

Preconditions: none (meta["val"] on the nodes read).
BEFORE:  p = aten.mul.Tensor(a, b)              y = aten.add.Tensor(p, c)
AFTER:   p = aten.mul.Tensor(a, b)   s = aten.clamp_min(p, -inf)   y = aten.add.Tensor(s, c)
Products: aten.mul (Tensor / Scalar), aten.square, aten.pow(x, 2), qlower.dequantize (its
lowering ends in a multiply), each also behind aten.neg (LLVM folds a negation into the FMA).
Sums: aten.add / aten.sub (Tensor and Scalar), aten.rsub.
Near misses left alone: integer products and sums; a product read by anything other than a sum
(a multiply of a multiply is two roundings on every engine); a sum of two non-products.
Postconditions: values identical (the clamp is the identity). Idempotent: a clamped operand is
not a product.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ...fx import call
from ..base import Pass, PassContext

_aten = torch.ops.aten
_SUMS = frozenset({_aten.add.Tensor, _aten.add.Scalar, _aten.sub.Tensor, _aten.sub.Scalar,
                   _aten.rsub.Tensor, _aten.rsub.Scalar})
_PRODUCTS = frozenset({_aten.mul.Tensor, _aten.mul.Scalar, _aten.square.default, torch.ops.qlower.dequantize.default})


def _float(node) -> bool:
    """A floating-point tensor value (any width: the contraction is not fp32's alone)."""
    val = node.meta.get("val") if isinstance(node, Node) else None
    return isinstance(val, torch.Tensor) and val.dtype.is_floating_point


def _is_product(node) -> bool:
    while isinstance(node, Node) and node.op == "call_function" and node.target is _aten.neg.default:
        node = node.args[0]
    if not (isinstance(node, Node) and node.op == "call_function"):
        return False
    return node.target in _PRODUCTS or (node.target is _aten.pow.Tensor_Scalar and node.args[1] in (2, 2.0))


class SeparateFloatProducts(Pass):
    name = "separate_float_products"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = 0
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target not in _SUMS or not _float(node):
                continue
            for operand in dict.fromkeys(a for a in node.args[:2] if _float(a) and _is_product(a)):
                with gm.graph.inserting_before(node):
                    barrier = call(gm, _aten.clamp_min.default, (operand, float("-inf")), like=operand)
                node.replace_input_with(operand, barrier)
                changed += 1
        if changed:
            ctx.rewrites["iree: float products read by a sum kept apart "
                         "(clamp_min -inf: no FMA contraction)"] += changed
            gm.recompile()
        return bool(changed)
