"""NameBitwiseOperators (iree legalization): Python's `&` and `^` on tensors, captured as
`aten.__and__` / `aten.__xor__`, are written as `aten.bitwise_and` / `aten.bitwise_xor`.

Why: torch-mlir in iree-compile 3.13 has no lowering for the dunder forms ("failed to legalize
operation 'torch.aten.__and__.Tensor'"; `__xor__` is left as a `torch.operator`), so a mask
combined with `&` (transformers' attention masks) kept those nodes in PyTorch and cut the
cluster around them; `bitwise_and` / `bitwise_xor` are the same function on bool and integer
tensors and compile (measured, tests/test_iree.py) — except `bitwise_xor.Scalar`, also left as a
`torch.operator`: `x ^ 3` becomes `bitwise_xor.Tensor` with a 0-d constant of the result dtype.

Preconditions: a call of `aten.__and__` / `aten.__xor__` (`.Tensor` or `.Scalar`).
BEFORE:  y = aten.__and__.Tensor(a, b)
AFTER:   y = aten.bitwise_and.Tensor(a, b)        (`__and__.Scalar` → `bitwise_and.Scalar`)
BEFORE:  y = aten.__xor__.Scalar(a, 3)
AFTER:   y = aten.bitwise_xor.Tensor(a, c)        (c: a 0-d constant 3 of result_type(a, 3))
Near misses left alone: `aten.bitwise_*` already, `aten.logical_and`, `aten.__or__`
(`|` compiles as it is).
Postconditions: the same values bit for bit (the ops are one function).
Idempotent: no dunder operator is left.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule

from ...fx import add_constant
from ..base import Pass, PassContext

_aten = torch.ops.aten
_SAME_FUNCTION = {_aten.__and__.Tensor: _aten.bitwise_and.Tensor, _aten.__and__.Scalar: _aten.bitwise_and.Scalar,
                  _aten.__xor__.Tensor: _aten.bitwise_xor.Tensor}


class NameBitwiseOperators(Pass):
    name = "name_bitwise_operators"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = 0
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target in _SAME_FUNCTION:
                node.target = _SAME_FUNCTION[node.target]
                changed += 1
            elif node.target is _aten.__xor__.Scalar or node.target is _aten.bitwise_xor.Scalar:
                tensor, scalar = node.args
                dtype = torch.result_type(tensor.meta["val"], scalar)
                with gm.graph.inserting_before(node):
                    constant = add_constant(gm, torch.tensor(scalar, dtype=dtype), "xor_scalar")
                node.target, node.args = _aten.bitwise_xor.Tensor, (tensor, constant)
                changed += 1
        if changed:
            ctx.rewrites["`&` / `^` written as bitwise_and / bitwise_xor (torch-mlir lowers only those)"] += changed
            gm.recompile()
        return bool(changed)
