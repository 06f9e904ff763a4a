"""Backend capability: which op schemas a backend accepts, with predicates, adjusted by
QLOWER_OP_ALLOWLIST / QLOWER_OP_DENYLIST (';'-separated schema names, e.g. 'aten::gelu')."""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Callable, Optional

from torch.fx import Node

from ..core.settings import settings
from ..fx import schema_name

ALLOW_ENV = "QLOWER_OP_ALLOWLIST"
DENY_ENV = "QLOWER_OP_DENYLIST"

# A predicate returns None when the node is supported, else the reason it is not.
Predicate = Callable[[Node], Optional[str]]
# Ops that move values around without computing; they never justify a cluster on their own.
STRUCTURAL = {"getitem", "aten::reshape", "aten::view", "aten::flatten.using_ints", "aten::permute",
              "aten::transpose.int", "aten::unsqueeze", "aten::squeeze.dim", "aten::contiguous",
              # arithmetic on sizes (export's runtime size checks): a cluster of only these is
              # not worth an engine call, and measured wrong in ONNX Runtime on data-dependent
              # sizes (masked_select's `u0 <= 100` check came back False)
              "aten::sym_size.int", "aten::sym_numel", "aten::sym_stride.int", "aten::sym_storage_offset",
              *(f.__name__ for f in (operator.add, operator.sub, operator.mul,
                                                            operator.floordiv, operator.mod, operator.ge,
                                                            operator.gt, operator.le, operator.lt,
                                                            operator.eq, operator.ne))}


def holds_empty_tensor(node: Node) -> bool:
    """An input or result of `node` has a static zero-size dim. Engines mishandle empty tensors
    in ways of their own (docs/trust.md, "empty tensors"); PyTorch runs them at no cost."""
    import torch
    for v in (node.meta.get("val"), *(a.meta.get("val") for a in node.all_input_nodes)):
        for t in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(t, torch.Tensor) and any(isinstance(d, int) and d == 0 for d in t.shape):
                return True
    return False


def _always(node: Node) -> str | None:
    """always"""
    return None


@dataclass
class Capability:
    backend: str
    ops: dict[str, Predicate] = field(default_factory=dict)

    def register(self, names, predicate: Predicate | None = None) -> None:
        for n in ([names] if isinstance(names, str) else names):
            self.ops[n] = predicate or _always



    def why_not(self, node: Node) -> str | None:
        """None when `node` is supported; otherwise a human-readable reason."""
        if node.op != "call_function":
            return f"{node.op} nodes are not compiled"
        name = schema_name(node)
        if name in settings().op_denylist:
            return f"{name} is in {DENY_ENV}"
        if name in settings().op_allowlist and name in self.ops:
            return None
        predicate = self.ops.get(name, self.ops.get("*"))
        if predicate is None:
            return f"{self.backend} has no lowering for {name}"
        why = predicate(node)
        return None if why is None else f"{name}: {why}"  # the report names the op it refused

    def refusing(self, refused: dict[str, str]) -> "Capability":
        """This capability, also refusing the nodes named in `refused` (node name -> reason):
        what a backend learned while compiling (a node its engine turned down) before it
        clusters the graph again."""
        if not refused:
            return self

        def wrap(predicate):
            return lambda node: refused.get(node.name) or predicate(node)
        return Capability(self.backend, {name: wrap(p) for name, p in self.ops.items()})

    def supports(self, node: Node) -> bool:
        return self.why_not(node) is None

    def table(self) -> list[tuple[str, str]]:
        """(schema name, condition) rows for `qlower ops`; a predicate's docstring is its condition."""
        deny, allow = settings().op_denylist, settings().op_allowlist
        rows = []
        for name, pred in sorted(self.ops.items()):
            if name in deny:
                rows.append((name, f"denied by {DENY_ENV}"))
            elif name in allow:
                rows.append((name, f"forced by {ALLOW_ENV}"))
            else:
                rows.append((name, (pred.__doc__ or "always").strip().splitlines()[0]))
        return rows
