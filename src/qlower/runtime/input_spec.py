"""What inputs a compiled model accepts, checked at every call."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.fx import GraphModule

from ..errors import InputError


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str
    shape: tuple[int | None, ...]      # None = dynamic dimension

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
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype != self.dtype:
            return f"expected dtype {self.dtype}, got {dtype}"
        if value.dim() != len(self.shape):
            return f"expected rank {len(self.shape)} {self.describe()}, got shape {list(value.shape)}"
        for axis, (want, got) in enumerate(zip(self.shape, value.shape)):
            if want is not None and want != got:
                return f"dim {axis} must be {want} ({self.describe()}), got shape {list(value.shape)}"
        return None


def input_specs_of(gm: GraphModule) -> list[InputSpec]:
    specs = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            shape = tuple(d if isinstance(d, int) else None for d in val.shape)
            specs.append(InputSpec(node.name, str(val.dtype).removeprefix("torch."), shape))
    return specs


def check_inputs(specs: list[InputSpec], args: tuple) -> None:
    if len(args) == len(specs):  # the common case: flat tensors, checked without building messages
        for spec, value in zip(specs, args):
            if type(value) is not torch.Tensor or not _fast_ok(spec, value):
                break
        else:
            return
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
            raise InputError(f"input {index} ('{spec.name}'): {problem}",
                             hint="dynamic dims must be declared with dynamic_shapes= at compile time")


def _fast_ok(spec: InputSpec, value) -> bool:
    if not isinstance(value, torch.Tensor) or value.dtype is not spec.torch_dtype:
        return False
    if spec.static:
        return value.shape == spec.shape  # torch.Size compares with a tuple
    return value.dim() == len(spec.shape) and all(w is None or w == g for w, g in zip(spec.shape, value.shape))
