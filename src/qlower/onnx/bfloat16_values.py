"""bfloat16 tensors at an ONNX Runtime cluster's boundary. ONNX Runtime computes bfloat16 inside a
session (Cast to and from it, and the kernels its CPU provider has), but its Python API neither
takes nor returns a bfloat16 array (numpy has no such dtype): a cluster with a bfloat16 input or
output could not run (OpInfo's `bfloat16`, x.bfloat16(), stayed in PyTorch). At the boundary a
bfloat16 value crosses as float32, which holds every bfloat16 exactly: the model's input is
float32 and Cast to bfloat16 first thing, a bfloat16 output is Cast to float32 last thing, and the
runner converts with `.float()` / `.to(torch.bfloat16)` — both exact, so the cluster computes what
a bfloat16 boundary would (ONNX Runtime's Cast to bfloat16 rounds as torch does: to nearest even,
NaN kept; measured on 100,000 values with ties, subnormals and the extremes)."""
from __future__ import annotations

import torch
from torch.fx import GraphModule


def _is_bfloat16(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype is torch.bfloat16


def bfloat16_positions(sub: GraphModule, constants: dict[int, torch.Tensor]) -> tuple[frozenset, frozenset]:
    """(runtime input positions, output positions) of the cluster's bfloat16 tensors (by meta value)."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    runtime = [p for i, p in enumerate(placeholders) if i not in constants]
    out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return (frozenset(i for i, p in enumerate(runtime) if _is_bfloat16(p.meta.get("val"))),
            frozenset(i for i, o in enumerate(outs) if hasattr(o, "meta") and _is_bfloat16(o.meta.get("val"))))


def as_float32(args: tuple, positions: frozenset) -> tuple:
    return tuple(a.float() if i in positions else a for i, a in enumerate(args))


def as_bfloat16(result, positions: frozenset, single: bool):
    if single:
        return result.to(torch.bfloat16)
    return tuple(t.to(torch.bfloat16) if i in positions else t for i, t in enumerate(result))


def widen_bfloat16_boundary(model) -> None:
    """Contract (an onnx_ir model, after translation):
    BEFORE  graph input x: bfloat16 ...             graph output y: bfloat16
    AFTER   graph input x: float32, Cast(x) -> bf16  Cast(y) -> float32 as the graph output
    post    no graph input or output of type bfloat16; the same values (both casts exact)."""
    import onnx_ir as ir
    graph = model.graph
    for i, value in enumerate(list(graph.inputs)):
        if value.dtype != ir.DataType.BFLOAT16:
            continue
        wide = ir.Value(name=value.name, shape=value.shape, type=ir.TensorType(ir.DataType.FLOAT))
        value.name = f"{wide.name}__bfloat16"
        cast = ir.node("Cast", [wide], attributes={"to": ir.DataType.BFLOAT16}, num_outputs=1)
        if len(graph):
            graph.insert_before(graph.node(0), cast)
        else:
            graph.append(cast)
        narrow = cast.outputs[0]
        narrow.name, narrow.shape, narrow.dtype = f"{wide.name}__as_bfloat16", value.shape, ir.DataType.BFLOAT16
        value.replace_all_uses_with(narrow, replace_graph_outputs=True)
        graph.inputs[i] = wide
    for i, value in enumerate(list(graph.outputs)):
        if value.dtype != ir.DataType.BFLOAT16:
            continue
        cast = ir.node("Cast", [value], attributes={"to": ir.DataType.FLOAT}, num_outputs=1)
        graph.append(cast)
        wide = cast.outputs[0]
        wide.name, wide.shape, wide.dtype = f"{value.name}__as_float32", value.shape, ir.DataType.FLOAT
        graph.outputs[i] = wide
