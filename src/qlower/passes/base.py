"""Pass infrastructure: the `Pass` base class and the `PassContext` passes share."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from torch.fx import GraphModule, Node

from ..meta import REFUSAL_KEY, Refusal
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
