"""Attention's matmuls made visible to the quantizer (QuantConfig.quantize_attention).

`torch.nn.functional.scaled_dot_product_attention` is captured as one ATen op, which the
quantizer leaves float: its two matmuls (Q·Kᵀ, P·V) then run in fp32 on every engine. On
OpenVINO that is most of the engine-native gap to NNCF (MiniLM-size encoder, seq 128, batch 8,
per-layer profile: the 12 fp32 attention MatMuls 18.1 ms of 90 ms, NNCF's int8 ones 8.1 ms;
head dim 32 makes them many small GEMMs, ~6x slower per multiply-add in fp32 than the int8
linears). This decomposes the op into its math form before annotation, so the quantizer puts
Q/DQ on q, k, v and the softmax probabilities like on any activation matmul.

BEFORE:  o = aten.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p=0, is_causal, scale)
AFTER:   a = matmul(q * scale, kᵀ) (+ mask or a causal -inf mask, or -inf where a bool mask is False)
         o = matmul(softmax(a, -1), v)
(grouped-query attention repeats k, v per head group first.) Float function unchanged up to
the rounding of a different summation order (tests/test_quantize.py). A program that writes its
state in place (a KV-cache decode step) cannot be re-traced by torch 2.13, so there the same
decomposition is spliced into the FX module (decompose_attention_in_module), whose traced matmuls
reshape with `_unsafe_view` (a shape op to the axis helper and the dequantize propagation).
"""
from __future__ import annotations

import logging
import math

import torch
from ..passes import PassContext
from ..passes.decompose_block_ops import DecomposeBlockOps

aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default


def _sdpa_math(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    # dropout_p is ignored: quantization runs in eval mode, where callers pass 0
    if enable_gqa:
        k = k.repeat_interleave(q.size(-3) // k.size(-3), -3)
        v = v.repeat_interleave(q.size(-3) // v.size(-3), -3)
    s = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
    a = torch.matmul(q * s, k.transpose(-2, -1))
    if is_causal:   # a float mask (-inf above the diagonal, 0 elsewhere): no bool ops, which
        # engines that lower only float and qlower ops (iree) would leave in PyTorch
        a = a + torch.full((q.size(-2), k.size(-2)), float("-inf"), dtype=a.dtype, device=q.device).triu(1)
    if attn_mask is not None:
        a = a.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else a + attn_mask
    return torch.matmul(torch.softmax(a, -1), v)


def writes_state(ep: torch.export.ExportedProgram) -> bool:
    """Does the program write its state (a KV cache's index_copy_)? torch 2.13's re-trace
    rejects those ("expected compiled_fn to be GraphModule"): decompose_attention_in_module."""
    return bool(ep.graph_signature.buffers_to_mutate) or any(_writes_in_place(n) for n in ep.graph.nodes)


def decompose_attention(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """The program with every scaled_dot_product_attention in its math form (unchanged if none,
    or if it writes its state: that one is decomposed on its module instead)."""
    if not any(n.target is SDPA for n in ep.graph.nodes) or writes_state(ep):
        return ep
    try:
        return ep.run_decompositions({SDPA: _sdpa_math})
    except Exception as exc:  # noqa: BLE001  (torch's re-trace)
        # attention then stays float, as in the transformer presets, and the user is told.
        logging.getLogger("qlower").warning(
            "quantize_attention: attention left in float (torch could not decompose this program: %s)",
            str(exc).strip().splitlines()[-1][:160])
        return ep


def decompose_attention_in_module(gm: torch.fx.GraphModule) -> None:
    """The same decomposition spliced into an FX module (KV-cache decode steps, which torch
    cannot re-trace as a program): the op traced on its node's values (DecomposeBlockOps with
    this one entry). An attention whose decomposition would read a symbolic size stays float,
    with the reason logged."""
    ctx = PassContext()
    DecomposeBlockOps(lambda node: False, why="quantize_attention", table={SDPA: _sdpa_math}).run(gm, ctx)
    for refusal in ctx.refusals:
        logging.getLogger("qlower").info("quantize_attention: attention left in float (%s)", refusal.reason)


def _writes_in_place(node) -> bool:
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    return schema is not None and schema.is_mutable
