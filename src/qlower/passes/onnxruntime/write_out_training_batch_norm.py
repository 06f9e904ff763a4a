"""WriteOutTrainingBatchNorm (onnxruntime legalization): batch normalization that updates running
statistics (training mode), or returns eval mode's empty saved statistics, is written out in
ATen ops torchlib translates; the update of the caller's running-statistics tensors is a
`copy_` into them that stays in PyTorch as an input write-back (like a buffer's).

Why: torchlib 0.7.2 translates training-mode batch norm with running statistics wrong (OpInfo
samples: the output off by up to 64, the statistics by 2), and eval-mode native_batch_norm's
saved statistics come back shape (C,) where eager's are (0,): these calls ran in PyTorch
(OpInfo: nn.functional.batch_norm, native_batch_norm, _native_batch_norm_legit).

Preconditions: meta['val'] on the inputs; static shapes; float input.
BEFORE:  y = aten.batch_norm(x, w, b, rm, rv, True, momentum, eps, cudnn)   (rm, rv graph inputs)
AFTER:   mean = aten.mean.dim(x, dims);  var = aten.var.correction(x, dims, correction=0)
         y = (x - mean) * rsqrt(var + eps) * w + b            (per channel, broadcast)
         aten.copy_(rm, rm * (1 - momentum) + mean * momentum)            # write-back
         aten.copy_(rv, rv * (1 - momentum) + var * n / (n - 1) * momentum)   # write-back
         (native_batch_norm / _native_batch_norm_legit: (y, mean, rsqrt(var + eps)); in eval
         mode: (x - rm) * rsqrt(rv + eps) * w + b and two empty (0,) statistics, as eager)
Near misses left alone: running statistics that are module buffers (FunctionalizeState's
business), absent ones (torchlib is right there), a channel of one value in training (eager
divides by n - 1 = 0), symbolic shapes, batch_norm in eval mode.
Postconditions: the same values to float32 rounding, the running statistics updated as
eager updates them. Idempotent: no batch-norm op with these arguments is left.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ...fx import call, full_args, replace_results
from ..base import Pass, PassContext
from ..functionalize_state import WRITE_BACK

A = torch.ops.aten
_RETURNS_STATISTICS = (A.native_batch_norm.default, A._native_batch_norm_legit.default)
TARGETS = (A.batch_norm.default, *_RETURNS_STATISTICS)


def _arguments(node: Node):
    """(x, weight, bias, running_mean, running_var, training, momentum, eps) of any of the three
    (_native_batch_norm_legit's no-stats overload is another OpOverload, not matched)."""
    return full_args(node)[:8]


def _static_float(v) -> bool:
    return isinstance(v, torch.Tensor) and v.dtype in (torch.float32, torch.float64) and \
        all(isinstance(d, int) for d in v.shape)


def _fires(node: Node) -> bool:
    if node.op != "call_function" or node.target not in TARGETS:
        return False
    x, _, _, rm, rv, training, _, _ = _arguments(node)
    val = x.meta.get("val")
    if not _static_float(val) or val.dim() < 2 or val.numel() == 0:
        return False
    if rm is None or rv is None or rm.op != "placeholder" or rv.op != "placeholder":
        return False
    if not training:
        return node.target in _RETURNS_STATISTICS
    return val.numel() // val.shape[1] > 1


class WriteOutTrainingBatchNorm(Pass):
    name = "write_out_training_batch_norm"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if not _fires(node):
                continue
            with gm.graph.inserting_before(node):
                results = _spelled_out(gm, node)
            replace_results(node, results[0] if node.target is A.batch_norm.default else results)
            gm.graph.erase_node(node)
            ctx.rewrites[f"{node.target.name()} spelled out"] += 1
            changed = True
        if changed:
            gm.recompile()
        return changed


def _spelled_out(gm: GraphModule, node: Node) -> tuple:
    x, w, b, rm, rv, training, momentum, eps = _arguments(node)
    val = x.meta["val"]
    c = lambda target, *args, **kwargs: call(gm, target, args, kwargs, like=node)
    per_channel = [1, val.shape[1]] + [1] * (val.dim() - 2)
    broadcast = lambda t: c(A.reshape.default, t, per_channel)
    if training:
        dims = [0, *range(2, val.dim())]
        mean = c(A.mean.dim, x, dims)
        var = c(A.var.correction, x, dims, correction=0)
    else:
        mean, var = rm, rv
    rstd = c(A.rsqrt.default, c(A.add.Tensor, var, eps))
    y = c(A.mul.Tensor, c(A.sub.Tensor, x, broadcast(mean)), broadcast(rstd))
    if w is not None:
        y = c(A.mul.Tensor, y, broadcast(w))
    if b is not None:
        y = c(A.add.Tensor, y, broadcast(b))
    if not training:
        empty = c(A.new_zeros.default, x, [0])
        return y, empty, c(A.new_zeros.default, x, [0])
    n = val.numel() // val.shape[1]
    _write_back(gm, node, rm, c(A.add.Tensor, c(A.mul.Tensor, rm, 1 - momentum), c(A.mul.Tensor, mean, momentum)))
    unbiased = c(A.mul.Tensor, var, n / (n - 1) * momentum)
    _write_back(gm, node, rv, c(A.add.Tensor, c(A.mul.Tensor, rv, 1 - momentum), unbiased))
    return y, mean, rstd


def _write_back(gm: GraphModule, like: Node, target: Node, value: Node) -> None:
    write = call(gm, A.copy_.default, (target, value), like=like)
    write.meta[WRITE_BACK] = True
