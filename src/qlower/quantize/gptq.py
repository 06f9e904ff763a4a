"""GPTQ (Frantar et al. 2023) for weight-only quantization: the columns of a linear's weight are
quantized one at a time, and each column's rounding error is spread over the columns not yet
quantized through the inverse of H = X^T X (the second moment of the linear's calibration
inputs), which minimizes ||X W^T - X Q^T|| to second order. A group's scale and zero point are
the numerics' own (numerics.weight_only_qparams), taken from the group's columns as they stand
when its first column is reached (earlier errors already spread into them); the codes are
numerics.quantize of each column with its group's qparams, so the program's dequantization is
the same as for round-to-nearest: only the choice of codes differs.

Linears that read the same input share H; the Hessians are measured on the float graph (every
linear sees float inputs, as it does at run time with float activations).
"""
from __future__ import annotations

import torch

from .. import numerics

BLOCK = 16    # columns updated together (the lazy batch update of the paper)


def damped_inverse_factor(h: torch.Tensor, damping: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(upper Cholesky factor of H^-1, dead columns) of H [L, K, K], in float64, with `damping`
    times the mean diagonal added; an input feature never nonzero in calibration ("dead") gets
    H[i, i] = 1."""
    h = h.to(torch.float64).clone()
    diag = torch.diagonal(h, dim1=-2, dim2=-1)
    dead = diag == 0
    diag[dead] = 1.0
    diag += damping * diag.mean(-1, keepdim=True)
    factor = torch.linalg.cholesky(h)
    inverse = torch.cholesky_inverse(factor)
    return torch.linalg.cholesky(inverse, upper=True), dead


def gptq(w: torch.Tensor, h: torch.Tensor, bits: int, group_size: int, symmetric: bool,
         damping: float = 0.01) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 [N, K], scale fp32 [N, G], zero point uint8 [N, G]) of weight w [N, K]."""
    codes, scale, zp = gptq_batched(w[None], h[None], bits, group_size, symmetric, damping)
    return codes[0], scale[0], zp[0]


def gptq_batched(w: torch.Tensor, h: torch.Tensor, bits: int, group_size: int, symmetric: bool,
                 damping: float = 0.01) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPTQ of L weights of one shape at once (w [L, N, K], h [L, K, K]; the same layer of
    every transformer block): the column loop runs once for all of them, the updates in
    float32 on the transposed weights (a column contiguous). Returns codes uint8 [L, N, K],
    scale fp32 [L, N, G], zero point uint8 [L, N, G]."""
    layers, n, k = w.shape
    hinv, dead = damped_inverse_factor(h, damping)
    hinv = hinv.to(torch.float32)
    work = torch.where(dead[:, :, None], 0.0, w.detach().to(torch.float32).transpose(1, 2)).contiguous()  # [L, K, N]
    groups = numerics.weight_groups(k, group_size)
    scale = torch.empty(layers, groups, n, dtype=torch.float32)
    zp = torch.empty(layers, groups, n, dtype=torch.uint8)
    codes = torch.empty(layers, k, n, dtype=torch.uint8)
    qmax = numerics.weight_only_qmax(bits)
    for start in range(0, k, BLOCK):
        end = min(start + BLOCK, k)
        block = work[:, start:end].clone()
        errors = torch.zeros_like(block)
        hblock = hinv[:, start:end, start:end]
        for i in range(end - start):
            col = start + i
            g = col // group_size
            if col % group_size == 0:
                ahead = torch.cat([block[:, i:], work[:, end:]], dim=1)[:, :group_size]     # [L, g, N]
                s, z = numerics.weight_only_qparams(ahead.transpose(1, 2).reshape(layers * n, -1), bits,
                                                    group_size, symmetric)
                scale[:, g], zp[:, g] = s.reshape(layers, n), z.reshape(layers, n)
                s_g, z_g = scale[:, g], zp[:, g].to(torch.int32)
            q = numerics.quantize(block[:, i], s_g, z_g, 0, qmax, torch.uint8)
            codes[:, col] = q
            err = (block[:, i] - numerics.dequantize(q, s_g, z_g)) / hblock[:, i, i][:, None]
            block[:, i:] -= hblock[:, i, i:, None] * err[:, None, :]
            errors[:, i] = err
        work[:, end:] -= hinv[:, start:end, end:].transpose(1, 2) @ errors
    return codes.transpose(1, 2).contiguous(), scale.transpose(1, 2).contiguous(), zp.transpose(1, 2).contiguous()
