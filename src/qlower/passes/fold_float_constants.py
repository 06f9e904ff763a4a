"""FoldFloatConstants: evaluate pure ops whose every tensor input is a float constant.

Preconditions: none (runs first).
BEFORE:  w = get_attr w_f32   wt = aten.t(w)   s = aten.mul.Tensor(wt, 0.5)   y = aten.linear(x, s)
AFTER:   c = get_attr (w_f32.t() * 0.5)                                       y = aten.linear(x, c)
Only deterministic, non-mutating ATen ops on float tensors; never ops on integer (quantized)
tensors — those are FoldQuantizedConstants' job, which keeps their qparams right — and never
quantize/dequantize themselves. Positions count as constants too: a factory with constant
arguments (aten.arange of a static length, full, zeros, ones; at most 2^16 elements) and int64 /
boolean values computed from constants only (8-, 16- and 32-bit integers are quantized data and
stay FoldQuantizedConstants'). So LLaMA's rotary tables `cos(arange(S) * inv_freq)` become
constants at a static sequence length, computed once by PyTorch, where each engine's cos/sin
differed from PyTorch's in the last bit on most inputs (4,096 x 32 angles: IREE 98,867,
onnxruntime 25,596 of 131,072 differ, AMD EPYC) and flipped the int8 codes after the rotation.
Postconditions: no call whose inputs are all float constants remains. Fixpoint; values equal
what PyTorch computes at run time (same kernels, evaluated once).
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ..fx import add_constant, constant_value
from .base import Pass, PassContext

_NONDETERMINISTIC = {"rand", "randn", "randint", "randperm", "bernoulli", "dropout", "normal", "uniform",
                     "empty", "empty_like", "new_empty", "empty_strided"}


_FACTORIES = frozenset({"arange", "full", "zeros", "ones", "scalar_tensor"})
FACTORY_MAX_ELEMENTS = 2 ** 16   # a constant made from nothing, kept small (ONNX / MLIR files carry it)
_POSITION_DTYPES = (torch.int64, torch.bool)   # index-like values, never quantized data


def _foldable(gm: GraphModule, node: Node) -> list[torch.Tensor] | None:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    schema = node.target._schema
    name = schema.name.split("::")[-1]
    if node.target.namespace != "aten" or schema.is_mutable or len(schema.returns) != 1 \
            or name in _NONDETERMINISTIC or not node.users:
        return None
    inputs = node.all_input_nodes
    if not inputs:
        return [] if name in _FACTORIES and _small_constant_tensor(node) else None
    values = [constant_value(gm, n) for n in inputs]
    if any(v is None or not (v.is_floating_point() or v.dtype in _POSITION_DTYPES) for v in values):
        return None
    if not any(v.is_floating_point() for v in values) and not _float_or_position(node.meta.get("val")):
        return None   # an op on positions only must give a float or position value too
    return values


def _float_or_position(val) -> bool:
    return isinstance(val, torch.Tensor) and (val.is_floating_point() or val.dtype in _POSITION_DTYPES)


def _small_constant_tensor(node: Node) -> bool:
    """A factory's result of static size <= FACTORY_MAX_ELEMENTS, float or position-typed."""
    val = node.meta.get("val")
    return _float_or_position(val) and all(isinstance(d, int) for d in val.shape) \
        and val.numel() <= FACTORY_MAX_ELEMENTS


class FoldFloatConstants(Pass):
    name = "fold_float_constants"
    fixpoint = True

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            values = _foldable(gm, node)
            if values is None:
                continue
            env = dict(zip(node.all_input_nodes, values))
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            with torch.no_grad():
                result = node.target(*args, **kwargs)
            if not isinstance(result, torch.Tensor):
                continue
            with gm.graph.inserting_before(node):
                const = add_constant(gm, result.contiguous(), "const")
            node.replace_all_uses_with(const)
            ctx.rewrites[f"folded {node.target.__name__} on float constants"
                         if values else f"folded {node.target.__name__} of constant arguments"] += 1
            changed = True
        if changed:
            gm.graph.eliminate_dead_code()
        return changed
