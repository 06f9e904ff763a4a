"""Weight-only quantized ops (namespace `qlower`): float activations, integer weight codes in
groups with their own scale and zero point (W4A16, W8A16). Reference kernels call
`qlower.numerics` (`linear_weight_only`, `embedding_weight_only`); fake kernels give shapes.

Operands: `codes` uint8 [N, K] (one b-bit code per value, unpacked: each engine's lowering
packs them its own way), `scale` fp32 [N, G], `zero_point` uint8 [N, G], G = ceil(K / group_size).
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import numerics

_NS = "qlower"


@torch.library.custom_op(f"{_NS}::linear_weight_only", mutates_args=())
def linear_weight_only(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                       bias: Optional[torch.Tensor], bits: int, group_size: int) -> torch.Tensor:
    return numerics.linear_weight_only(x, codes, scale, zero_point, bias, group_size)


@linear_weight_only.register_fake
def _(x, codes, scale, zero_point, bias, bits, group_size):
    return x.new_empty((*x.shape[:-1], codes.shape[0]), dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::embedding_weight_only", mutates_args=())
def embedding_weight_only(ids: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                          bits: int, group_size: int) -> torch.Tensor:
    return numerics.embedding_weight_only(ids, codes, scale, zero_point, group_size)


@embedding_weight_only.register_fake
def _(ids, codes, scale, zero_point, bits, group_size):
    return codes.new_empty((*ids.shape, codes.shape[1]), dtype=torch.float32)
