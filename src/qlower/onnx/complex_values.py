"""Complex tensors at an ONNX Runtime cluster's boundary. ONNX Runtime's CPU kernels have no
complex types; torch.onnx writes a complex64 value as float32 with a trailing dim of 2 (real,
imaginary) and translates the complex ops (FFTs, stft, abs, mul, ...) on that form. Inside a
cluster that is all it takes; at its boundary a complex input is fed as `view_as_real` and a
complex output read back with `view_as_complex` (both views: no copy)."""
from __future__ import annotations

import torch
from torch.fx import GraphModule


def is_complex(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype.is_complex


def complex_inputs(node) -> bool:
    """An FX node reading a complex tensor (from its inputs' meta values)."""
    return any(is_complex(a.meta.get("val")) for a in node.all_input_nodes)


def boundary_positions(sub: GraphModule, constants: dict[int, torch.Tensor], picks) -> tuple[frozenset, frozenset]:
    """(runtime input positions, output positions) of the cluster's values `picks` selects (by
    meta value): the complex ones here, the bfloat16 ones in bfloat16_values.py."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    runtime = [p for i, p in enumerate(placeholders) if i not in constants]
    out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return (frozenset(i for i, p in enumerate(runtime) if picks(p.meta.get("val"))),
            frozenset(i for i, o in enumerate(outs) if hasattr(o, "meta") and picks(o.meta.get("val"))))


def complex_positions(sub: GraphModule, constants: dict[int, torch.Tensor]) -> tuple[frozenset, frozenset]:
    """(runtime input positions, output positions) of the cluster's complex tensors."""
    return boundary_positions(sub, constants, is_complex)


def as_real_pairs(args: tuple, positions: frozenset) -> tuple:
    return tuple(torch.view_as_real(a.resolve_conj()) if i in positions else a for i, a in enumerate(args))


def as_complex(result, positions: frozenset, single: bool):
    if single:
        return torch.view_as_complex(result)
    return tuple(torch.view_as_complex(t) if i in positions else t for i, t in enumerate(result))
