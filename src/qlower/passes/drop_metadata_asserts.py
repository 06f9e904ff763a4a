"""DropMetadataAsserts: remove `aten._assert_tensor_metadata` nodes.

torch.export leaves these behind (for `.to(dtype)` calls): they re-check at run time a dtype /
device / layout that export already proved and recorded in meta['val']. In a compiled graph
they only cost a call, and worse, they keep intermediate values alive as cluster outputs and
block the single-cluster fast path.

Preconditions: none; run after InlineGradModeRegions (the asserts inside a grad-mode region,
LLaMA's rotary embedding, reach the main graph only then: run before it, three were left
reading cluster values, which became extra cluster outputs and blocked ONNX export).
BEFORE:  y = aten.to.dtype(x, int64);  aten._assert_tensor_metadata(y, dtype=int64);  z = f(y)
AFTER:   y = aten.to.dtype(x, int64);  z = f(y)
Not fired: data-dependent checks (`_assert_scalar`, `_assert_async`), which guard facts that
export could not prove.
Postconditions: no `_assert_tensor_metadata` node remains. Idempotent; values unchanged.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule

from .base import Pass, PassContext


class DropMetadataAsserts(Pass):
    name = "drop_metadata_asserts"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        asserts = [n for n in gm.graph.nodes
                   if n.op == "call_function" and n.target is torch.ops.aten._assert_tensor_metadata.default]
        for node in asserts:
            gm.graph.erase_node(node)
        if asserts:
            ctx.rewrites["metadata assert dropped (proved at export)"] += len(asserts)
        return bool(asserts)
