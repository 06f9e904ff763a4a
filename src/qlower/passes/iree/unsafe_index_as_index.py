"""UnsafeIndexAsIndex (iree legalization): `aten._unsafe_index.Tensor` is written as
`aten.index.Tensor`.

Why: torch-mlir in iree-compile 3.13 leaves `_unsafe_index` as a `torch.operator` ("failed to
legalize operation 'torch.operator' that was explicitly marked illegal"), and torch's own
decompositions emit it — bilinear upsampling's (`backend._decompose_ops_iree_lacks`, MobileViT)
gathers its four neighbours with it. `_unsafe_index` is `index` without the bounds check: on
indices in range (the decompositions clamp theirs) the two are one function, and `index` lowers.

Preconditions: a call of `aten._unsafe_index.Tensor`.
BEFORE:  y = aten._unsafe_index.Tensor(x, [None, None, h, w])
AFTER:   y = aten.index.Tensor(x, [None, None, h, w])
Near misses left alone: `aten.index.Tensor` already; `_unsafe_index_put`.
Postconditions: the same values for in-range indices (out of range, `index` raises where
`_unsafe_index` read any memory); the node's meta marks it (`UNCHECKED_INDEX`), so the
capability does not take it for a user's index that needs eager's bounds check. Idempotent: no `_unsafe_index` is left.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule

from ..base import Pass, PassContext

_aten = torch.ops.aten
# node meta key: an index whose values its producer keeps in range (not checked against eager's IndexError)
UNCHECKED_INDEX = "qlower_unchecked_index"


class UnsafeIndexAsIndex(Pass):
    name = "unsafe_index_as_index"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = 0
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is _aten._unsafe_index.Tensor:
                node.target = _aten.index.Tensor
                node.meta[UNCHECKED_INDEX] = True   # (argument_checks: in range by construction)
                changed += 1
        if changed:
            ctx.rewrites["_unsafe_index written as index (torch-mlir lowers only that)"] += changed
            gm.recompile()
        return bool(changed)
