"""The values the TOSA emitter and its op lowerings pass around, and the module it produces."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

U8_OFFSET = 128


@dataclass
class Val:
    """An emitted tensor value: `stored = real - offset` (offset 128 for uint8, else 0)."""
    value: object        # ir.Value
    dtype: torch.dtype   # the dtype the FX graph gives it
    shape: list[int]
    offset: int = 0
    # (source, perm) when this value is `tosa.transpose(source, perm)`: a later transpose composes
    # with it, so NCHW <-> NHWC pairs around convs, requantize and pools cancel at emission
    transposed_from: tuple | None = field(default=None, repr=False, compare=False)


def offset_of(dtype: torch.dtype) -> int:
    return U8_OFFSET if dtype == torch.uint8 else 0


@dataclass
class EmittedModule:
    asm: str
    input_dtypes: list[torch.dtype]
    output_dtypes: list[torch.dtype]
    single_output: bool
    op_names: list[str] = field(default_factory=list)   # MLIR ops in the function, for inspection
    # positions of the inputs CHECKED_ENTRY also sums (one tensor<1xf32> result each, after the
    # outputs); empty: the module has `main` only
    input_sums: tuple[int, ...] = ()


class Emitter(Protocol):
    """What an op lowering of tosa_ops.py receives: the emitter it writes into
    (tosa_emit.TosaEmitter), named here so the lowerings do not import the emitter that
    imports them."""
