"""RnnSeqFirst: batch-first recurrent layers become sequence-first ones between two permutes.

ONNX LSTM/GRU (and ONNX Runtime's kernels, which refuse `layout = 1`) and TOSA work sequence
first. A batch-first layer therefore needs a transpose of its input and of its output. Made
explicit here, in the graph, the input transpose is an ordinary shape op: PropagateDequantize
moves the input's dequantize below it, so it transposes uint8 values and merges with the
producer's own transposes (the zoo's conv → transpose(1, 2) → LSTM becomes one uint8
Transpose). Hidden inside the recurrent op, ONNX Runtime's transpose optimizer leaves a float
DQ → Transpose → Q → DQ chain instead.

Preconditions: none (runs before qparams are attached; works on float and Q/DQ graphs).
BEFORE:  out = aten.lstm.input(x, hx, w, True, layers, 0.0, False, False, True)     # x: [B, S, I]
         y = out[0]                                                              # y: [B, S, H]
AFTER:   xs = aten.permute(x, [1, 0, 2])
         out = aten.lstm.input(xs, hx, w, True, layers, 0.0, False, False, False)
         y = aten.permute(out[0], [1, 0, 2])
(likewise aten.gru.input and the block ops qlower::lstm / qlower::gru; states are [layers, B, H]
in both layouts and are untouched.)
Near misses left alone: batch_first = False, unbatched (2-D) input.
Postconditions: values bit-identical (the same recurrence on the same numbers); no recurrent op
with batch_first = True and a 3-D input. Idempotent.
"""
from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node

from ..fx import call
from .base import Pass, PassContext

aten = torch.ops.aten
_RNNS = (aten.lstm.input, aten.gru.input, torch.ops.qlower.lstm.default, torch.ops.qlower.gru.default)
_TO_SEQ_FIRST = [1, 0, 2]   # its own inverse


class RnnSeqFirst(Pass):
    name = "rnn_seq_first"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target not in _RNNS or node.args[-1] is not True:
                continue
            x = node.args[0]
            if x.meta["val"].dim() != 3 or any(u.target is not operator.getitem for u in node.users):
                continue
            with gm.graph.inserting_before(node):
                xs = call(gm, aten.permute.default, (x, _TO_SEQ_FIRST), like=node)
                rnn = call(gm, node.target, (xs, *node.args[1:-1], False), like=node)
            for user in list(node.users):
                with gm.graph.inserting_before(user):
                    item = call(gm, operator.getitem, (rnn, user.args[1]), like=user)
                    new = item if user.args[1] != 0 else self._batch_first(gm, item, user)
                user.replace_all_uses_with(new)
                gm.graph.erase_node(user)
            gm.graph.erase_node(node)
            ctx.rewrites["recurrent layer made sequence-first"] += 1
            changed = True
        return changed

    @staticmethod
    def _batch_first(gm: GraphModule, item: Node, like: Node) -> Node:
        return call(gm, aten.permute.default, (item, _TO_SEQ_FIRST), like=like)
