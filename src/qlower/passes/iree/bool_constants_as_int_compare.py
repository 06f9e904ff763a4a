"""BoolConstantsAsIntCompare (iree legalization): a boolean tensor created from sizes and a value
(`new_ones(..., dtype=bool)`, `full(..., True)`, `ones_like(mask)`) is created as int32 and
compared with 0.

Why: torch-mlir in iree-compile 3.13 fails to legalize the boolean splat such ops become
("failed to legalize operation 'torch.vtensor.literal' ... dense<true>"), so every transformers
model would keep its attention-mask `new_ones(dtype=bool)` in PyTorch — the one fallback of BERT,
GPT-2, LLaMA, ... fp32 on IREE (evaluator-style sweep). The int32 splat and
`ne` compile (measured).

Preconditions: a call of a creation op (`new_ones`, `new_full`, `ones`, `ones_like`, `full`,
`full_like`, `new_empty`, `empty`, `empty_like`, `scalar_tensor`) whose result is bool.
BEFORE:  m = aten.new_ones(x, [2, 1, 4], dtype=torch.bool)
AFTER:   i = aten.new_ones(x, [2, 1, 4], dtype=torch.int32);  m = aten.ne.Scalar(i, 0)
         (a fill value True/False becomes 1/0)
Near misses left alone: creation ops of any other dtype; `zeros`/`new_zeros` (compile as they are).
Postconditions: the same boolean values (an `empty` one's are undefined either way).
Idempotent: every creation op it leaves is int32.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule

from ...fx import call
from ..base import Pass, PassContext

_aten = torch.ops.aten
_CREATION = frozenset({_aten.new_ones.default, _aten.new_full.default, _aten.ones.default, _aten.ones_like.default,
                       _aten.full.default, _aten.full_like.default, _aten.new_empty.default, _aten.empty.memory_format,
                       _aten.empty_like.default, _aten.scalar_tensor.default})
_FILL_VALUE_AT = {_aten.new_full.default: 2, _aten.full.default: 1, _aten.full_like.default: 1,
                  _aten.scalar_tensor.default: 0}


class BoolConstantsAsIntCompare(Pass):
    name = "bool_constants_as_int_compare"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = 0
        for node in list(gm.graph.nodes):
            val = node.meta.get("val")
            if node.op != "call_function" or node.target not in _CREATION or \
                    not isinstance(val, torch.Tensor) or val.dtype is not torch.bool:
                continue
            args = list(node.args)
            at = _FILL_VALUE_AT.get(node.target)
            if at is not None and isinstance(args[at], bool):
                args[at] = int(args[at])
            with gm.graph.inserting_before(node):
                created = call(gm, node.target, args, {**node.kwargs, "dtype": torch.int32}, like=node)
                boolean = call(gm, _aten.ne.Scalar, (created, 0), like=node)
            node.replace_all_uses_with(boolean)
            gm.graph.erase_node(node)
            changed += 1
        if changed:
            ctx.rewrites["boolean tensor created as int32 != 0 (torch-mlir fails on the boolean splat)"] += changed
            gm.recompile()
        return bool(changed)
