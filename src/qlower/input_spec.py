"""What inputs a compiled model accepts, checked at every call."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.fx import GraphModule

from .errors import InputError
from .shapes import finite_bound


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str
    shape: tuple[int | None, ...]      # None = dynamic dimension
    # per dim: None (static or unknown range) or (min, max) with max None = unbounded; a dynamic
    # dim beyond its declared range would run on a program never checked for that size
    bounds: tuple[tuple[int, int | None] | None, ...] = ()

    @functools.cached_property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @functools.cached_property
    def static(self) -> bool:
        return None not in self.shape

    def describe(self) -> str:
        dims = ", ".join("*" if d is None else str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]"

    def problem(self, value) -> str | None:
        if not isinstance(value, torch.Tensor):
            return f"expected a tensor {self.describe()}, got {type(value).__name__}"
        storage = storage_problem(value)
        if storage:
            return storage
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype != self.dtype:
            return f"expected dtype {self.dtype}, got {dtype}"
        if value.dim() != len(self.shape):
            return f"expected rank {len(self.shape)} {self.describe()}, got shape {list(value.shape)}"
        for axis, (want, got) in enumerate(zip(self.shape, value.shape)):
            if want is not None and want != got:
                return f"dim {axis} must be {want} ({self.describe()}), got shape {list(value.shape)}"
        for axis, (bound, got) in enumerate(zip(self.bounds, value.shape)):
            if bound is not None and not _within(bound, got):
                lo, hi = bound
                return (f"dynamic dim {axis} is {got}, outside its declared range [{lo}, "
                        f"{'inf' if hi is None else hi}] ({self.describe()})")
        return None

    def hint_for(self, value) -> str:
        """The fix for `problem(value)`: each kind of mismatch has its own."""
        if not isinstance(value, torch.Tensor):
            return "call the compiled model with tensors, as the original model was called"
        if storage_problem(value):
            return storage_hint(value)
        if str(value.dtype).removeprefix("torch.") != self.dtype:
            return f"convert the input with .to(torch.{self.dtype}), or compile with example inputs of that dtype"
        if value.dim() != len(self.shape):
            return "pass inputs of the rank the model was compiled with"
        outside = [(b, g) for b, g in zip(self.bounds, value.shape) if b is not None and not _within(b, g)]
        if outside and any(g < 2 and b[0] == 2 for b, g in outside):
            # Dim.AUTO / Dim.DYNAMIC (and a Dim with min=2): torch.export traces sizes 0 and 1 apart
            return ("torch.export captures a size declared with Dim.AUTO / Dim.DYNAMIC from 2 (0 and 1 "
                    "are special cases); recompile with torch.export.Dim('name', min=0) in dynamic_shapes= "
                    "to include them")
        if outside:
            return "recompile with a wider torch.export.Dim(min=..., max=...) in dynamic_shapes="
        return "dims that vary must be declared with dynamic_shapes= at compile time"


def storage_problem(value: torch.Tensor) -> str | None:
    """Why a tensor cannot be an input at all, whatever its dtype and shape: it has no values
    (meta device), is not a dense strided tensor (sparse, mkldnn), or is not in CPU memory.
    Engines would read garbage, fail deep inside, or (IREE) hand back a meta tensor."""
    if value.is_meta:
        return "is on the meta device (it has no values)"
    if value.layout is not torch.strided:
        return f"is a {str(value.layout).removeprefix('torch.')} tensor, not a dense (strided) one"
    if not value.is_cpu:
        return f"is on device {value.device}, not the CPU"
    return None


def storage_hint(value: torch.Tensor) -> str:
    if value.is_meta:
        return "pass a tensor with values, e.g. torch.empty_like(x, device='cpu') filled with the data"
    if value.layout is not torch.strided:
        return "convert it with .to_dense()"
    return "move it with .cpu()"


def _within(bound: tuple[int, int | None], size: int) -> bool:
    lo, hi = bound
    return lo <= size and (hi is None or size <= hi)


def input_specs_of(gm: GraphModule, range_constraints: dict | None = None) -> list[InputSpec]:
    """One spec per tensor placeholder; dynamic dims get their declared (min, max) from the
    program's range constraints (or, failing that, the shape environment)."""
    specs = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            shape = tuple(d if isinstance(d, int) else None for d in val.shape)
            bounds = tuple(None if isinstance(d, int) else _range_of(d, range_constraints) for d in val.shape)
            specs.append(InputSpec(node.name, str(val.dtype).removeprefix("torch."), shape,
                                   bounds if any(b is not None for b in bounds) else ()))
    return specs


def _range_of(dim, range_constraints: dict | None) -> tuple[int, int | None] | None:
    expr = getattr(getattr(dim, "node", None), "expr", None)
    if expr is None:
        return None
    vr = (range_constraints or {}).get(expr)
    if vr is None:
        shape_env = getattr(dim.node, "shape_env", None)
        vr = getattr(shape_env, "var_to_range", {}).get(expr) if shape_env is not None else None
    if vr is None:
        return None
    lo, hi = finite_bound(vr.lower), finite_bound(vr.upper)
    return max(lo or 0, 0), hi


def flat_checker(specs: list[InputSpec]):
    """A predicate for the common call: `args` are exactly the specs' tensors, flat, each of its
    dtype and an accepted shape. Precomputed per model, so a call pays one comparison per input
    (measured on the zoo LSTM, 3 inputs: 1.2 us, `check_inputs` 4.4 us). False sends the call to
    `check_inputs`, which names the problem or accepts a nested call."""
    n, tensor, strided = len(specs), torch.Tensor, torch.strided
    if all(s.static for s in specs):
        wanted = tuple((s.torch_dtype, torch.Size(s.shape)) for s in specs)

        def static_ok(args: tuple) -> bool:
            if len(args) != n:
                return False
            for value, (dtype, shape) in zip(args, wanted):
                if type(value) is not tensor or value.dtype is not dtype or value.shape != shape \
                        or not value.is_cpu or value.layout is not strided:
                    return False
            return True
        return static_ok

    def dynamic_ok(args: tuple) -> bool:
        return len(args) == n and all(type(v) is tensor and _fast_ok(s, v) for s, v in zip(specs, args))
    return dynamic_ok


def check_inputs(specs: list[InputSpec], args: tuple) -> None:
    """Raise an InputError naming the first problem, or accept the call (a nested one too);
    the common flat call is `flat_checker`'s, before this."""
    leaves = args if all(type(a) is torch.Tensor for a in args) else torch.utils._pytree.tree_leaves(args)
    if len(leaves) == len(specs) and all(_fast_ok(s, v) for s, v in zip(specs, leaves)):
        return
    if len(leaves) != len(specs):
        want = ", ".join(s.describe() for s in specs)
        raise InputError(f"expected {len(specs)} input(s) ({want}), got {len(leaves)}",
                         hint="call the compiled model with the same inputs as the original")
    for index, (spec, value) in enumerate(zip(specs, leaves)):
        problem = spec.problem(value)
        if problem:
            raise InputError(f"input {index} ('{spec.name}'): {problem}", hint=spec.hint_for(value))


def _fast_ok(spec: InputSpec, value) -> bool:
    if not isinstance(value, torch.Tensor) or value.dtype is not spec.torch_dtype \
            or not value.is_cpu or value.layout is not torch.strided:   # meta, sparse, another device
        return False
    if spec.static:
        return value.shape == spec.shape  # torch.Size compares with a tuple
    return value.dim() == len(spec.shape) and all(w is None or w == g for w, g in zip(spec.shape, value.shape)) \
        and all(b is None or _within(b, g) for b, g in zip(spec.bounds, value.shape))
