"""FoldEmptyTensors: a tensor with no elements is known at compile time, and so is every pure op
whose tensor inputs all have none.

Preconditions: none (shapes from capture; runs before quantization passes read the graph).
BEFORE:  e = aten.slice(x, 1, 0, 0)       # (4, 0): statically empty
         v = aten.var.correction(e, [1])  # (4,): NaN, whatever x holds
         p = aten.mm(a, b)                # a (3, 0), b (0, 5) inputs: zeros (3, 5)
AFTER:   e = get_attr (empty (4, 0))   v = get_attr (NaN × 4)   p = get_attr (zeros (3, 5))

Why: engines disagree with eager on empty tensors, in silence — ONNX Runtime's MatMul with K = 0
returned uninitialized memory, its ReduceMean of nothing 0 (eager NaN), torchlib's cat refuses
"all empty" inputs, Reshape of an empty batch with a -1 is rejected — and each such node split a
cluster or ran in PyTorch. An empty tensor has no values, so PyTorch itself computes the answer
once here (the same kernels eager runs) and no engine sees the op.

Rules, for a deterministic, non-mutating ATen op with static shapes:
  1. every tensor output has a 0 dim       -> an empty constant of that shape and dtype
  2. every tensor input has a 0 dim (and   -> the op evaluated on empty tensors, its result a
     there is at least one)                   constant (a tuple result: each getitem reader)
An op eager refuses on empty tensors (amax of nothing raises) stays as it is, for eager's error
at run time. Random ops are left to rule 1 (no values to draw).
Postconditions: no pure ATen node with a statically empty tensor output, or with only
statically empty tensor inputs, remains. Fixpoint; values equal eager's.
"""
from __future__ import annotations

import operator
import warnings

import torch
from torch.fx import GraphModule, Node

from ..fx import add_constant
from .base import Pass, PassContext


def is_statically_empty(value) -> bool:
    """A tensor value whose shape is all integers and holds no elements."""
    return (isinstance(value, torch.Tensor)
            and all(isinstance(d, int) for d in value.shape) and value.numel() == 0)


def _pure(node: Node) -> bool:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    return target.namespace == "aten" and not target._schema.is_mutable and bool(node.users)


def _seeded(node: Node) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def _outputs(node: Node) -> list:
    val = node.meta.get("val")
    return list(val) if isinstance(val, (tuple, list)) else [val]


def _tensor_inputs(node: Node) -> list[Node]:
    return [n for n in node.all_input_nodes if isinstance(n.meta.get("val"), torch.Tensor)]


def _static(value) -> bool:
    return not isinstance(value, torch.Tensor) or all(isinstance(d, int) for d in value.shape)


def _empty_like_value(value) -> torch.Tensor:
    return torch.empty(tuple(value.shape), dtype=value.dtype)


def _evaluated_on_empty_inputs(node: Node):
    """The op's result on real empty tensors, or None where eager raises (or sizes are symbolic)."""
    inputs = node.all_input_nodes
    if not all(is_statically_empty(n.meta.get("val")) for n in inputs):
        return None   # a size (sym_size) or a non-empty tensor feeds it
    env = {n: _empty_like_value(n.meta["val"]) for n in inputs}
    args = torch.fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # eager's own warning ("var(): degrees of freedom is <= 0") is for run time
            warnings.simplefilter("ignore")
            return node.target(*args, **kwargs)
    except Exception:   # eager's own error on empty input: left for run time, where eager raises it
        return None


class FoldEmptyTensors(Pass):
    name = "fold_empty_tensors"
    fixpoint = True

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            outputs = _outputs(node)
            if not _pure(node) or not all(_static(v) for v in outputs):
                continue
            if all(isinstance(v, torch.Tensor) for v in outputs) and all(is_statically_empty(v) for v in outputs):
                result = [_empty_like_value(v) for v in outputs]
                result = result if isinstance(node.meta["val"], (tuple, list)) else result[0]
                how = "an empty result"
            elif _tensor_inputs(node) and not _seeded(node):
                result = _evaluated_on_empty_inputs(node)
                how = "empty inputs"
            else:
                continue
            if result is not None and self._replace(gm, node, result):
                ctx.rewrites[f"folded {node.target.__name__} of {how}"] += 1
                changed = True
        if changed:
            gm.graph.eliminate_dead_code()
        return changed

    @staticmethod
    def _replace(gm: GraphModule, node: Node, result) -> bool:
        if isinstance(result, torch.Tensor):
            with gm.graph.inserting_before(node):
                node.replace_all_uses_with(add_constant(gm, result.contiguous(), "empty_fold"))
            return True
        readers = list(node.users)
        if not isinstance(result, (tuple, list)) or not all(
                r.op == "call_function" and r.target is operator.getitem and isinstance(result[r.args[1]], torch.Tensor)
                for r in readers):
            return False
        for reader in readers:
            with gm.graph.inserting_before(reader):
                reader.replace_all_uses_with(add_constant(gm, result[reader.args[1]].contiguous(), "empty_fold"))
        return True
