"""IntegerSoftmax: a softmax over the last dim of an 8-bit per-tensor dequantized value is
computed from an exp table and an exact integer sum (numerics.softmax_integer).

Preconditions: CanonicalizeQDQ ran (qlower.dequantize carries QParams).
BEFORE:  d = qlower.dequantize(q, s, zp)      p = aten.softmax(d, -1)
AFTER:   p = qlower.softmax_integer(q, T)     T[k] = RNE(2^16 exp(-s k)), k = 0..255
Why: softmax(x) = exp(x - max x) / sum, and with x = s(q - zp) the exponent is -s*k for the
integer k = max q - q in [0, 255]: 256 possible values, tabulated once. The float softmax's exp
and its sum are each engine's own (vectorized exp approximations, reduction orders); here the
sum is an exact int32 sum and one IEEE division is left, which every backend computes alike.
The table's 2^-16 grid is far below the uint8 step (1/255) the output is usually quantized to.
Masked (attention's padding mask, as `quantize_attention` decomposes a boolean attn_mask):
BEFORE:  p = aten.softmax(aten.masked_fill(d, aten.bitwise_not(keep), -inf), -1)
AFTER:   p = qlower.softmax_integer(q, T, keep)   (max over kept codes, masked entries 0)
Without it the float softmax between two integer matmuls was the one op of HF BERT's int8
attention whose ulps differ between engines (and flip the P codes the next matmul reads).
Near misses left alone: a softmax over another dim, a per-channel or 16-bit dequantize, a row
longer than 32,767 (the int32 sum could overflow; a symbolic length counts by its upper bound),
a softmax with a dtype argument, a masked_fill with another value than -inf.
Postconditions: no softmax reads an 8-bit per-tensor dequantize over its last dim, directly or
through a masked_fill of -inf. Idempotent.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from .. import numerics
from ..fx import add_constant, call
from ..meta import QPARAMS_KEY
from ..shapes import size_bound
from .base import Pass, PassContext, is_eight_bit_dequantize

aten = torch.ops.aten
qlower = torch.ops.qlower
_SOFTMAX = (aten.softmax.int, aten._softmax.default)


class IntegerSoftmax(Pass):
    name = "integer_softmax"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target not in _SOFTMAX or not _integer_form(node):
                continue
            dq, mask = _operands(node)
            masked = node.args[0] if mask is not None else None
            with gm.graph.inserting_before(node):
                table = add_constant(gm, numerics.softmax_exp_table(dq.meta[QPARAMS_KEY].scale[0]), "exp_table")
                keep = () if mask is None else (_negated(gm, mask),)
                new = call(gm, qlower.softmax_integer.default, (dq.args[0], table, *keep), like=node)
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
            for gone in (masked, mask, dq):   # each once nothing else reads it
                if gone is not None and not gone.users:
                    gm.graph.erase_node(gone)
            ctx.rewrites["masked softmax of an 8-bit value -> exp table" if mask is not None
                         else "softmax of an 8-bit value -> exp table"] += 1
            changed = True
        return changed


def _operands(node: Node) -> tuple[Node, Node | None]:
    """(the dequantize the softmax reads, the masked_fill's mask or None)."""
    x = node.args[0]
    if isinstance(x, Node) and x.target is aten.masked_fill.Scalar and x.args[2] == float("-inf"):
        return x.args[0], x.args[1]
    return x, None


def _negated(gm: GraphModule, mask: Node) -> Node:
    """keep = ~mask: the operand of a bitwise/logical not, else a new bitwise_not."""
    if mask.target in (aten.bitwise_not.default, aten.logical_not.default) and \
            mask.args[0].meta["val"].dtype == torch.bool:
        return mask.args[0]
    return call(gm, aten.bitwise_not.default, (mask,), like=mask)


def _integer_form(node: Node) -> bool:
    dq, mask = _operands(node)
    if not is_eight_bit_dequantize(dq):
        return False
    if mask is not None and (not isinstance(mask, Node) or mask.meta["val"].dtype != torch.bool):
        return False
    shape = dq.meta["val"].shape
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if not isinstance(dim, int) or dim % len(shape) != len(shape) - 1:
        return False
    extra = node.args[2] if len(node.args) > 2 else node.kwargs.get("dtype", node.kwargs.get("half_to_float"))
    if extra not in (None, False):
        return False
    return node.meta["val"].dtype == torch.float32 and size_bound(shape[-1]) <= numerics.SOFTMAX_MAX_N
