"""PadSingleWindowConvs (iree legalization): a float conv2d with ONE window in a spatial dim that
stops short of the input's end reads an explicitly padded input cropped to that window.

Why: torch-mlir mis-sizes such a conv and iree-compile rejects the module ("'linalg.generic' op
inferred input/output operand #1 has shape's dimension #1 to be 4, but found 3"; measured over
conv2d with H 3-8 x W 6, kernel 1-3, stride 1-4, padding 0-1: the 19 failures of 144 were exactly
these — `lowerings._short_single_window_conv`, found by the IREE fuzz run), so it would be refused and
run in PyTorch (MobileViT's fp32 model: one fallback). A single window reads padded positions
[0, d(k-1)+1) whatever the stride; with the padding written out and the input cropped there, the
window ends at the input's end — the form torch-mlir sizes right.

Preconditions: `aten.conv2d.default` on a float 4-D input with static spatial sizes, integer
padding (not "same"/"valid"), and a spatial dim where n + 2p - d(k-1) - 1 is in (0, stride).
BEFORE:  y = aten.conv2d(x, w, b, [2, 1], [1, 1], [1, 1], g)   # x [N, C, 2, 6], w [O, C/g, 3, 3]
AFTER:   xp = aten.constant_pad_nd(x, [0, 0, 1, 1])           # that dim's padding written out
         xc = aten.slice(xp, 2, 0, 3)                          # cropped to the one window
         y  = aten.conv2d(xc, w, b, [1, 1], [0, 1], [1, 1], g) # stride / padding 1 / 0 there
Near misses left alone: kernel 1 in that dim; a window ending at the input's end (span 0); two
or more windows; string padding; `qlower.conv2d` (integer convs are TOSA).
Postconditions: the same values (zero padding is the padding; the one window reads the same
elements), the same output shape, dynamic dims (the batch) still symbolic. Idempotent: the
rewritten conv has span 0 in those dims.
"""
from __future__ import annotations

import contextlib

import torch
import torch._refs
from torch.fx import GraphModule, Node

from ...fx import call, fake_mode_of, full_args
from ..base import Pass, PassContext
from ...pool_geometry import window_span

_aten = torch.ops.aten


def _pair(v) -> list[int]:
    v = [v] if isinstance(v, int) else list(v)
    return v * 2 if len(v) == 1 else v


def short_single_window_dims(node: Node) -> list[int]:
    """The spatial dims (0: H, 1: W) of float conv2d `node` with one window stopping short of
    the input's end; [] when there are none or the conv is not of the form handled."""
    if node.op != "call_function" or node.target is not _aten.conv2d.default:
        return []
    x, w, _, stride, padding, dilation = full_args(node)[:6]
    val = x.meta.get("val")
    if isinstance(padding, str) or not isinstance(val, torch.Tensor) or val.dim() != 4 or not val.is_floating_point():
        return []
    found = []
    geometry = zip(val.shape[-2:], w.meta["val"].shape[-2:], _pair(stride), _pair(padding), _pair(dilation))
    for i, (n, k, s, p, d) in enumerate(geometry):
        if isinstance(n, int) and k > 1 and 0 < window_span(n, k, p, d) < s:
            found.append(i)
    return found


def _padded(gm: GraphModule, x: Node, pads: list[int], like: Node) -> Node:
    """aten.constant_pad_nd(x, pads), its value from torch's reference implementation: the aten
    op's own fake kernel specializes a dynamic batch to the example's size (guard Eq(s, 2),
    torch 2.13), which makes a dynamic-batch model static on IREE — at batch 3 it returns a
    batch-2 output, silently (found by the IREE fuzz run); `torch._refs.constant_pad_nd`
    keeps the symbol."""
    node = gm.graph.call_function(_aten.constant_pad_nd.default, (x, pads, 0.0))
    if "stack_trace" in like.meta:
        node.meta["stack_trace"] = like.meta["stack_trace"]
    mode = fake_mode_of(gm)
    with mode if mode is not None else contextlib.nullcontext():
        node.meta["val"] = torch._refs.constant_pad_nd(x.meta["val"], pads, 0.0)
    return node


class PadSingleWindowConvs(Pass):
    name = "pad_single_window_convs"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = 0
        for node in list(gm.graph.nodes):
            short = short_single_window_dims(node)
            if not short:
                continue
            x, w, b, stride, padding, dilation, groups = full_args(node)[:7]
            stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
            kernel = w.meta["val"].shape[-2:]
            pads = [0, 0, 0, 0]                       # constant_pad_nd order: W left/right, H left/right
            with gm.graph.inserting_before(node):
                for i in short:
                    pads[2 * (1 - i)] = pads[2 * (1 - i) + 1] = padding[i]
                x = _padded(gm, x, pads, like=node)
                for i in short:
                    x = call(gm, _aten.slice.Tensor, (x, 2 + i, 0, dilation[i] * (kernel[i] - 1) + 1), like=node)
                    stride[i], padding[i] = 1, 0
                conv = call(gm, _aten.conv2d.default, (x, w, b, stride, padding, dilation, groups), like=node)
            node.replace_all_uses_with(conv)
            gm.graph.erase_node(node)
            changed += 1
        if changed:
            ctx.rewrites["single-window conv2d cropped to its window (torch-mlir mis-sizes it)"] += changed
            gm.recompile()
        return bool(changed)
