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

BLOCK = 32    # columns updated together (the lazy batch update of the paper)


def damped_inverse_factor(h: torch.Tensor, damping: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(upper Cholesky factor of H^-1, dead columns): computed in float64 from H with `damping` times the mean
    diagonal added; an input feature never nonzero in calibration ("dead") gets H[i, i] = 1."""
    h = h.to(torch.float64).clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    h += damping * torch.mean(torch.diag(h)) * torch.eye(h.shape[0], dtype=h.dtype)
    factor = torch.linalg.cholesky(h)
    inverse = torch.cholesky_inverse(factor)
    return torch.linalg.cholesky(inverse, upper=True), dead


def gptq(w: torch.Tensor, h: torch.Tensor, bits: int, group_size: int, symmetric: bool,
         damping: float = 0.01) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 [N, K], scale fp32 [N, G], zero point uint8 [N, G]) of weight w [N, K]; the
    updates in float32."""
    n, k = w.shape
    hinv, dead = damped_inverse_factor(h, damping)
    hinv = hinv.to(torch.float32)
    work = w.detach().to(torch.float32).clone()
    work[:, dead] = 0.0
    groups = numerics.weight_groups(k, group_size)
    scale = torch.empty(n, groups, dtype=torch.float32)
    zp = torch.empty(n, groups, dtype=torch.uint8)
    codes = torch.empty(n, k, dtype=torch.uint8)
    qmax = numerics.weight_only_qmax(bits)
    for start in range(0, k, BLOCK):
        end = min(start + BLOCK, k)
        block = work[:, start:end].clone()
        errors = torch.zeros_like(block)
        hblock = hinv[start:end, start:end]
        for i in range(end - start):
            col = start + i
            g = col // group_size
            if col % group_size == 0:
                ahead = torch.cat([block[:, i:], work[:, end:]], dim=1)[:, :group_size]
                s, z = numerics.weight_only_qparams(ahead, bits, group_size, symmetric)
                scale[:, g], zp[:, g] = s[:, 0], z[:, 0]
            column = block[:, i]
            q = numerics.quantize(column, scale[:, g], zp[:, g].to(torch.int32), 0, qmax, torch.uint8, axis=0)
            codes[:, col] = q
            dq = numerics.dequantize(q, scale[:, g], zp[:, g].to(torch.int32), axis=0)
            err = (block[:, i] - dq) / hblock[i, i]
            block[:, i:] -= err[:, None] * hblock[i, i:][None, :]
            errors[:, i] = err
        work[:, end:] -= errors @ hinv[start:end, end:]
    return codes, scale, zp
