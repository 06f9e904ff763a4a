"""SplitAccumulation (openvino legalization, canonical numerics): an integer linear whose int32
accumulator may exceed 2^24 becomes linears over slices of its input features, each bounded,
whose int32 accumulators are added.

Why: OpenVINO's CPU plugin accumulates MatMulInteger in fp32 (capability.py: 1-LSB errors once
|accumulator| > 2^24), so unsplit, such a linear is refused and runs in PyTorch — every FFN down-projection
of a BERT-base-size encoder (K = 3072: bound ~2.5e7), 12 PyTorch fallbacks and 321 ms a call at
batch 1 × 128 against onnxruntime's 47 ms. Each slice's accumulator is an
integer below 2^24, exact in fp32; their sum is an int32 add (exact), then the requantize reads
the same int32 accumulator as before.

Preconditions: `qlower.linear` with constant weights and weight zero points (what the capability
bounds); static input-feature dim.
BEFORE:  acc = qlower.linear(x, zx, W, zw, b)                      # sum|W - zw| * max|x - zx| + |b| >= 2^24
AFTER:   acc = aten.add(qlower.linear(x[..., :k1], zx, W[:, :k1], zw, b),
                        qlower.linear(x[..., k1:], zx, W[:, k1:], zw, None))   # each < 2^24
Near misses left alone: linears within the bound; a single input feature whose column alone
exceeds it (no split can help); non-constant weights.
Postconditions: the same int32 accumulator (integer arithmetic, reassociated). Idempotent: every
linear it writes is within the bound.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ...fx import add_constant, call, constant_value, full_args
from ..base import Pass, PassContext
from ...numerics import EXACT_SUM, max_centered

_LINEAR = torch.ops.qlower.linear.default


def _column_bounds(node: Node) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(per input feature and output channel |w - zw| * max|x - zx|, per channel |bias|) as
    int64, or None when the weights are not constants."""
    x, x_zp, w, w_zp, bias = full_args(node)[:5]
    gm = node.graph.owning_module
    w, w_zp = constant_value(gm, w), constant_value(gm, w_zp)
    xv = x.meta.get("val") if isinstance(x, Node) else None
    if w is None or w_zp is None or xv is None or w.dim() != 2:
        return None
    centered = (w.to(torch.int64) - w_zp.to(torch.int64).reshape(-1, 1)).abs() * max_centered(xv.dtype, int(x_zp))
    b = constant_value(gm, bias) if isinstance(bias, Node) else None
    return centered, (b.to(torch.int64).abs() if b is not None else torch.zeros(w.shape[0], dtype=torch.int64))


def split_points(columns: torch.Tensor, bias: torch.Tensor) -> list[int] | None:
    """Input-feature boundaries [0, k1, ..., K] cutting the columns greedily so that every
    channel's partial sum stays below 2^24 (the bias counts in the first slice); None when no
    split is needed or one column alone reaches the bound."""
    if int((columns.sum(1) + bias).max()) < EXACT_SUM:
        return None
    cuts, running = [0], bias.clone()
    for k in range(columns.shape[1]):
        col = columns[:, k]
        if int(col.max()) >= EXACT_SUM:
            return None
        if int((running + col).max()) >= EXACT_SUM:
            cuts.append(k)
            running = torch.zeros_like(running)
        running = running + col
    return cuts + [columns.shape[1]]


class SplitAccumulation(Pass):
    name = "split_accumulation"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = 0
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target is not _LINEAR:
                continue
            bounds = _column_bounds(node)
            cuts = split_points(*bounds) if bounds is not None else None
            if cuts is None:
                continue
            x, x_zp, w, w_zp, bias = full_args(node)[:5]
            weight = constant_value(gm, w)
            with gm.graph.inserting_before(node):
                total = None
                for i, (k0, k1) in enumerate(zip(cuts, cuts[1:])):
                    xs = call(gm, torch.ops.aten.slice.Tensor, (x, -1, k0, k1), like=node)
                    ws = add_constant(gm, weight[:, k0:k1].contiguous(), "split_weight")
                    part = call(gm, _LINEAR, (xs, x_zp, ws, w_zp, bias if i == 0 else None), like=node)
                    total = part if total is None else call(gm, torch.ops.aten.add.Tensor, (total, part), like=node)
            node.replace_all_uses_with(total)
            gm.graph.erase_node(node)
            changed += 1
        if changed:
            ctx.rewrites["linear split where its accumulator may exceed 2^24 (openvino accumulates in fp32)"] += changed
            gm.graph.eliminate_dead_code()
            gm.recompile()
        return bool(changed)
