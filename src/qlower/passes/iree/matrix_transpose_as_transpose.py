"""MatrixTransposeAsTranspose (iree legalization): `x.mT` (and `mH`, `adjoint` on real tensors) is written
as `aten.transpose.int(x, -2, -1)`.

Why: torch-mlir in iree-compile 3.13 imports `aten.mT` / `aten.mH` / `aten.adjoint` as a
`torch.operator` it cannot legalize ("failed to legalize operation 'torch.operator' that was
explicitly marked illegal"), so a cluster holding `k.mT` — common in
attention code — would fall back to PyTorch whole. For a real tensor all three are the transpose of
the last two dims (the conjugate of a real number is itself), which lowers.

Preconditions: a call of `aten.mT` / `aten.mH` / `aten.adjoint` on a real tensor of rank >= 2.
BEFORE:  y = aten.mT(x)
AFTER:   y = aten.transpose.int(x, -2, -1)
Near misses left alone: a complex input to `mH` / `adjoint` (a conjugate too); `aten.t`,
`aten.numpy_T`, `transpose` already.
Postconditions: the same view of the same values. Idempotent: none of the three is left.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule

from ..base import Pass, PassContext

_aten = torch.ops.aten
_MATRIX_TRANSPOSES = (_aten.mT.default, _aten.mH.default, _aten.adjoint.default)


class MatrixTransposeAsTranspose(Pass):
    name = "matrix_transpose_as_transpose"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = 0
        for node in gm.graph.nodes:
            if node.op != "call_function" or node.target not in _MATRIX_TRANSPOSES:
                continue
            val = node.args[0].meta.get("val") if hasattr(node.args[0], "meta") else None
            if not isinstance(val, torch.Tensor) or val.dim() < 2 or val.dtype.is_complex:
                continue
            node.target, node.args, node.kwargs = _aten.transpose.int, (node.args[0], -2, -1), {}
            changed += 1
        if changed:
            ctx.rewrites["mT / mH / adjoint written as transpose (torch-mlir lowers only that)"] += changed
            gm.recompile()
        return bool(changed)
