"""Symbolic shapes: turn the symbolic dims recorded on an FX graph (FakeTensor values in
node.meta["val"]) back into concrete example inputs and a `torch.export` dynamic_shapes spec, so
a graph that qlower rewrote can be captured again with the same dims still dynamic."""
from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import optimization_hint


def dynamic_spec(vals: list[torch.Tensor], named: bool = True, ranges: dict | None = None) -> tuple:
    """One dynamic_shapes entry per value: {dim index: Dim} for its symbolic dims (None when all
    are static). named=True gives one `Dim` per symbol, with the symbol's recorded range, shared
    by every value that uses it (export then proves the same equalities); named=False gives
    Dim.AUTO everywhere (export infers relations itself). `ranges` (sympy symbol -> ValueRanges,
    an ExportedProgram's range_constraints) overrides the shape environment's ranges, whose
    lower bound is 2 for sizes the user declared from 1 (export's 0/1 specialisation)."""
    dims: dict[str, object] = {}
    spec = []
    for val in vals:
        per_input = {i: (_dim_for(d, dims, ranges or {}) if named else torch.export.Dim.AUTO)
                     for i, d in enumerate(val.shape) if not isinstance(d, int)}
        spec.append(per_input or None)
    return tuple(spec)


def example_inputs(vals: list[torch.Tensor]) -> tuple:
    """Zero tensors with the vals' dtypes and shapes, symbolic sizes at their hints."""
    return tuple(torch.zeros([d if isinstance(d, int) else optimization_hint(d, fallback=2) for d in v.shape],
                             dtype=v.dtype) for v in vals)


def _dim_for(d: torch.SymInt, dims: dict, ranges: dict) -> object:
    expr = d.node.expr
    if not expr.is_Symbol:
        return torch.export.Dim.AUTO
    name = str(expr)
    if name not in dims:
        rng = ranges.get(expr) or d.node.shape_env.var_to_range.get(expr)
        lo = (finite_bound(rng.lower) if rng is not None else None) or 0
        lo = min(lo, 1) if expr not in ranges else lo
        hi = finite_bound(rng.upper) if rng is not None else None
        dims[name] = torch.export.Dim(f"d_{name}", min=lo, max=hi) if hi is not None \
            else torch.export.Dim(f"d_{name}", min=lo)
    return dims[name]


def finite_bound(bound) -> int | None:
    """A range bound as an int; None for an unbounded one. torch's `int_oo` says `is_finite`
    True and `int()` of it raises, as does sympy's `oo` (AttributeError in sympy 1.14): a
    `Dim("batch", min=2)` without max raised a raw exception at compile."""
    from torch.utils._sympy.numbers import IntInfinity, NegativeIntInfinity
    if isinstance(bound, (IntInfinity, NegativeIntInfinity)) or getattr(bound, "is_finite", True) is False:
        return None
    try:
        return int(bound)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None


def user_input_values(ep: torch.export.ExportedProgram) -> list:
    """meta["val"] of the program's user inputs, in order."""
    names = set(ep.graph_signature.user_inputs)
    return [n.meta["val"] for n in ep.graph.nodes if n.op == "placeholder" and n.name in names]


def size_bound(v) -> float:
    """|v| for an int; for a SymInt the shape environment's bound on |v| (a declared Dim max),
    2^31 - 1 where it has none (no tensor dim reaches that)."""
    if isinstance(v, int):
        return float(abs(v))
    try:
        ranges = v.node.shape_env.bound_sympy(v.node.expr)
        return float(max(abs(int(ranges.upper)), abs(int(ranges.lower))))
    except Exception:   # unbounded (int_oo), or not a symbol the shape environment knows
        return float(2 ** 31 - 1)
