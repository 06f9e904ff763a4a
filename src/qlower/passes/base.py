"""Pass infrastructure: the `Pass` base class and the `PassContext` passes share."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Node

from ..meta import QPARAMS_KEY, REFUSAL_KEY, Refusal
from ..numerics import Profile


@dataclass
class PassContext:
    """State shared by one compilation's passes: options in, decisions out."""
    profile: Profile = "float"
    refusals: list[Refusal] = field(default_factory=list)
    rewrites: Counter = field(default_factory=Counter)
    # FoldQuantizedConstants: (source storages, op, args) -> (buffer name, fake value), so
    # constants folded from the same storage by the same op stay one buffer (tied weights).
    folded_constants: dict = field(default_factory=dict)

    def refuse(self, pass_name: str, node: Node, reason: str) -> None:
        refusal = Refusal(pass_name, node.name, reason)
        node.meta[REFUSAL_KEY] = refusal
        if refusal not in self.refusals:
            self.refusals.append(refusal)


class Pass:
    """A graph rewrite. Subclasses set `name`, document their contract (preconditions,
    BEFORE/AFTER, postconditions) in the class docstring, and implement `run`, which mutates
    `gm.graph` in place and returns whether anything changed. `fixpoint = True` makes the
    manager repeat the pass until it reports no change."""
    name: str = "pass"
    fixpoint: bool = False

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        raise NotImplementedError


def is_eight_bit_dequantize(node) -> bool:
    """A qlower.dequantize of a uint8/int8 value with one scale and zero point: one code decides
    each value, so 256 values cover everything it can produce (the integer float-island passes)."""
    if not (isinstance(node, Node) and node.target is torch.ops.qlower.dequantize.default):
        return False
    qp = node.meta.get(QPARAMS_KEY)
    eight_bit = (torch.uint8, torch.int8)
    return qp is not None and not qp.per_channel and qp.dtype in eight_bit \
        and node.args[0].meta["val"].dtype in eight_bit


def replace_and_drop(gm: GraphModule, old: Node, new: Node, dropped: list[Node], dequantize: Node) -> None:
    """`old`'s uses go to `new`; `old`, then `dropped` (last first), are erased, and `dequantize`
    too once nothing reads it."""
    old.replace_all_uses_with(new)
    for node in [old, *reversed(dropped)]:
        gm.graph.erase_node(node)
    if not dequantize.users:
        gm.graph.erase_node(dequantize)

