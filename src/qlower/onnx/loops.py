"""Loops in qlower's decompositions (orthogonal_polynomials.py, incomplete_gamma.py): torch's
`while_loop`, which torch.onnx translates to an ONNX Loop."""
from __future__ import annotations

import torch


def while_loop_of_static_shapes(cond, body, carried):
    """torch's while_loop (torch.onnx translates it to an ONNX Loop), traced with dynamo's
    automatic dynamic shapes off. while_loop traces cond and body through dynamo, which caches
    them by code object: a second trace with other shapes marked the sizes dynamic and lifted
    them as extra loop inputs without meta values (measured: hermite_h at (5,) then (3, 7) in one
    process, SpecViolationError "Node.meta arg8_1 is missing val field" on re-capture, the
    cluster in PyTorch). Conds and bodies are module-level and close over nothing: what they
    need is carried."""
    from torch._higher_order_ops.while_loop import while_loop
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        return while_loop(cond, body, carried)
