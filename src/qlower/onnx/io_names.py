"""The model's own names for its flat inputs and outputs: the forward's argument names (the
captured program's placeholders) and names from the output structure (a dict's keys, a
transformers `ModelOutput`'s fields, a tuple's positions as `output_0`, ...).
Exported ONNX graphs carry them, and `cm.report()` shows them."""
from __future__ import annotations

import re

import torch
from torch.fx import GraphModule
from torch.utils import _pytree


def input_names(gm: GraphModule) -> list[str]:
    """The graph's placeholder names, in order (torch.export names them after the arguments)."""
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"]


def _flat_outputs(gm: GraphModule) -> int:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    return len(out) if isinstance(out, (tuple, list)) else 1


def _key_text(key) -> str:
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def output_names(gm: GraphModule) -> list[str]:
    """One name per flat output: the key path through the output structure ("last_hidden_state",
    "logits", "scores_0"), "output" for a single tensor, "output_<i>" for a tuple's elements;
    a name an input or an earlier output holds gets a suffix (`x` -> `x_1`)."""
    count = _flat_outputs(gm)
    spec = getattr(gm, "_out_spec", None)
    paths = None
    if spec is not None and spec.num_leaves == count:
        try:   # the structure rebuilt around stand-in leaves, then flattened with its key paths
            tree = _pytree.tree_unflatten([torch.zeros(()) for _ in range(count)], spec)
            paths = [path for path, _ in _pytree.tree_flatten_with_path(tree)[0]]
        except Exception:  # noqa: BLE001  (a structure without key paths: positional names)
            paths = None
    if paths is None or len(paths) != count:
        paths = [(_pytree.SequenceKey(i),) for i in range(count)] if count > 1 else [()]
    names = []
    for path in paths:
        parts = [_key_text(k) for k in path]
        if not parts:
            name = "output"
        elif isinstance(path[0], _pytree.SequenceKey):
            name = "_".join(["output", *parts])
        else:
            name = "_".join(parts)
        names.append(re.sub(r"[^0-9A-Za-z_.]", "_", name))
    inputs = input_names(gm)   # a graph value has one name: an output named like an input is suffixed
    return unique(inputs + names)[len(inputs):]


def unique(names: list[str]) -> list[str]:
    """`names` with repeats suffixed (`x`, `x_1`)."""
    seen: set[str] = set()
    out = []
    for name in names:
        candidate, k = name, 0
        while candidate in seen:
            k += 1
            candidate = f"{name}_{k}"
        seen.add(candidate)
        out.append(candidate)
    return out
