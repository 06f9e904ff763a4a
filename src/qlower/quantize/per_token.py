"""Run-time activation quantization in the Q/DQ program: per token, or per tensor (dynamic).

After convert_pt2e, a linear layer annotated per-token (QuantConfig.activations="per-token")
reads a float activation and a dequantized int8 weight. This step makes the run-time
quantization of the activation explicit, so the Q/DQ program describes itself (a saved program
needs no config to be lowered) and runs in eager with the canonical numerics:

BEFORE:  y = linear(x, dequantize_per_channel(w_i8, sw), b)
AFTER:   s = qlower.token_scale(x); q = qlower.quantize_per_token(x, s)
         y = linear(qlower.dequantize_per_token(q, s), dequantize_per_channel(w_i8, sw), b)

(and the same for addmm(b, x, DQ(W)) with W [in, out]). LowerPerTokenLinear turns the AFTER form
into an integer GEMM.

QuantConfig.activations="dynamic" quantizes the whole tensor with its own range instead (ONNX
DynamicQuantizeLinear, numerics.quantize_dynamic):
AFTER:   q, s, zp = qlower.quantize_dynamic(x)
         y = linear(qlower.dequantize_dynamic(q, s, zp), dequantize_per_channel(w_i8, sw), b)
and LowerDynamicLinear turns that into one qlower.linear_dynamic.
"""
from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node

from ..fx import is_dequantize

aten = torch.ops.aten
qlower = torch.ops.qlower

# op -> (activation arg index, weight arg index)
PER_TOKEN_OPS = {aten.linear.default: (0, 1), aten.addmm.default: (1, 2)}


def insert_run_time_qdq(gm: GraphModule, activations: str) -> int:
    """Quantize weight-quantized linears' inputs at run time as `activations` says ("per-token"
    or "dynamic"); "static" changes nothing. Returns how many linears were rewritten."""
    if activations == "per-token":
        return insert_per_token_qdq(gm)
    if activations == "dynamic":
        return _insert(gm, qlower.dequantize_dynamic.default, _quantized_dynamic)
    return 0


def insert_per_token_qdq(gm: GraphModule) -> int:
    """Quantize the float activation of every weight-quantized linear/addmm per token; returns
    how many were rewritten. Idempotent: a rewritten activation is a dequantize_per_token.
    Linears reading one activation (an attention block's q/k/v projections, a gated MLP's
    gate/up) share its quantization: it is a function of the activation alone, and each copy
    is ~10 small ONNX Runtime nodes (MiniLM-s32: 2.3 of 4.7 ms were per-token quantization)."""
    return _insert(gm, qlower.dequantize_per_token.default, _quantized_per_token)


def _insert(gm: GraphModule, dequantize, quantized) -> int:
    count = 0
    shared: dict[Node, Node] = {}
    for node in list(gm.graph.nodes):
        where = PER_TOKEN_OPS.get(node.target) if node.op == "call_function" else None
        if where is None:
            continue
        x, w = node.args[where[0]], node.args[where[1]]
        # An input that is already statically quantized (a producer with output qparams, e.g. a
        # conv under requantize_outputs=True) is quantized per token as well: the config asks for
        # per-token linear inputs, and the extra rounding is what that producer's setting costs.
        if not (isinstance(x, Node) and is_dequantize(w)) or x.target is dequantize:
            continue
        if x not in shared:
            shared[x] = quantized(gm, x, node)
        node.update_arg(where[0], shared[x])
        count += 1
    if count:
        gm.recompile()
    return count


def _quantized_per_token(gm: GraphModule, x: Node, first_user: Node) -> Node:
    """dequantize_per_token(quantize_per_token(x, s), s), s = token_scale(x), before the first
    linear reading x (nodes are visited in order, so every later reader comes after it)."""
    with gm.graph.inserting_before(first_user):
        scale = gm.graph.call_function(qlower.token_scale.default, (x,))
        q = gm.graph.call_function(qlower.quantize_per_token.default, (x, scale))
        xd = gm.graph.call_function(qlower.dequantize_per_token.default, (q, scale))
    _trace_from(first_user, (scale, q, xd))
    return xd


def _quantized_dynamic(gm: GraphModule, x: Node, first_user: Node) -> Node:
    """dequantize_dynamic(*quantize_dynamic(x)) before the first linear reading x."""
    with gm.graph.inserting_before(first_user):
        qsz = gm.graph.call_function(qlower.quantize_dynamic.default, (x,))
        parts = [gm.graph.call_function(operator.getitem, (qsz, i)) for i in range(3)]
        xd = gm.graph.call_function(qlower.dequantize_dynamic.default, tuple(parts))
    _trace_from(first_user, (qsz, *parts, xd))
    return xd


def _trace_from(user: Node, nodes) -> None:
    if "stack_trace" in user.meta:
        for n in nodes:
            n.meta["stack_trace"] = user.meta["stack_trace"]
