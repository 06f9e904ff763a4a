"""DropNoopCeilMode (iree legalization): a 2-D max/avg pool whose `ceil_mode=True` changes
nothing is written with `ceil_mode=False`.

Why: torch-mlir's ceil-mode pool lowering mis-sizes exactly these pools and iree-compile rejects
the module ("'linalg.generic' op inferred input/output operand ... dimension"); measured over
max/avg pools (count_include_pad False and True), n in 3..9, kernel 1-4, stride 1-4, padding
0..k//2: all 42 failures of 376 were such no-op cases (backends/pool_geometry.py has the rule).

Preconditions: static spatial sizes on the pool's input (otherwise the rule leaves it alone).
BEFORE:  y = aten.max_pool2d(x, [2, 2], [2, 2], [0, 0], [1, 1], True)     # x 8x8: no partial window
AFTER:   y = aten.max_pool2d(x, [2, 2], [2, 2], [0, 0], [1, 1], False)
Near misses left alone: a pool where ceil mode adds a window (7x7 input, kernel 2, stride 2);
ceil_mode=False pools; other ops.
Postconditions: values identical (same output size, same windows). Idempotent: a rewritten pool
has ceil_mode=False.
"""
from __future__ import annotations

from torch.fx import GraphModule

from ..base import Pass, PassContext
from ...pool_geometry import drop_noop_ceil_mode


class DropNoopCeilMode(Pass):
    name = "drop_noop_ceil_mode"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = drop_noop_ceil_mode(gm)
        if changed:
            ctx.rewrites["iree: ceil_mode=False on pools where it changes nothing "
                         "(torch-mlir mis-sizes them)"] += changed
        return bool(changed)
