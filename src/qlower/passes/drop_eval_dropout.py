"""DropEvalDropout: remove dropouts that are identities (`train=False`).

qlower captures in eval mode, and transformers' modules call `nn.functional.dropout(x, p,
training=self.training)`: torch.export keeps each as `aten.dropout(x, p, False)`, a node that
returns its input. Between a linear and the residual add that reads it, such a node hides the
linear's quantized output from the quantizer's annotation (it looks through shape-only ops,
not through dropout), so the `int8` preset left HF BERT's, GPT-2's and ViT's residual adds,
and the LayerNorms after them, in float (5 dropouts in each of the zoo's two-layer models).
It runs before annotation (`quantize._quantize_once`) and first in the pipeline (programs
captured elsewhere).

Preconditions: none.
BEFORE:  d = aten.dropout(h, 0.1, False);  y = aten.add(x, d)
AFTER:   y = aten.add(x, h)
Not fired: `train=True` (random: kept, and never folded); a `train` that is not a constant.
Covers aten.dropout, feature_dropout (nn.Dropout1d/2d/3d), alpha_dropout, feature_alpha_dropout.
Postconditions: no dropout with train=False remains. Idempotent; values unchanged.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from .base import Pass, PassContext

aten = torch.ops.aten
DROPOUTS = (aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default,
            aten.feature_alpha_dropout.default)


def _train_argument(node: Node):
    return node.args[2] if len(node.args) > 2 else node.kwargs.get("train")


def is_eval_dropout(node: Node) -> bool:
    return node.op == "call_function" and node.target in DROPOUTS and _train_argument(node) is False


class DropEvalDropout(Pass):
    name = "drop_eval_dropout"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        dropouts = [n for n in gm.graph.nodes if is_eval_dropout(n)]
        for node in dropouts:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
        if dropouts:
            ctx.rewrites["eval-mode dropout dropped (identity)"] += len(dropouts)
        return bool(dropouts)
