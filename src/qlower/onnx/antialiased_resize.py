"""Antialiased bilinear resizing for the calls torchlib translates wrongly: align_corners=True,
and explicit scales next to an output size (OpInfo's _upsample_bilinear2d_aa: off by 1.9 and by
8.1). Written as two small matrix products, out = W_h · x · W_wᵀ, each W (out × in) built from
aranges with eager's formula: area_pixel_compute_scale ((in - 1) / (out - 1) with align_corners,
else 1 / the given scale or in / out), the triangle filter widened by the scale when
downsampling, each output's window [trunc(center - support + 0.5), trunc(center + support + 0.5))
and its weights normalized. Measured against eager: within 8e-6 on randn input (up- and
downsampling, both corners modes, scales and sizes). Static sizes, 4-D input.
"""
from __future__ import annotations

import math

import torch

from .conditional import only_when, static

A = torch.ops.aten


def _axis_weights(n_in: int, n_out: int, align_corners: bool, scale_opt, dtype):
    if align_corners:
        scale = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        scale = 1.0 / scale_opt if scale_opt is not None and scale_opt > 0 else n_in / n_out
    support = scale if scale >= 1.0 else 1.0
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    i = A.unsqueeze.default(A.arange.default(n_out, dtype=torch.float64), 1)
    j = A.unsqueeze.default(A.arange.default(n_in, dtype=torch.float64), 0)
    center = A.mul.Scalar(A.add.Scalar(i, 0.5), scale)
    low = A.clamp_min.default(A.trunc.default(A.add.Scalar(center, 0.5 - support)), 0.0)
    high = A.clamp_max.default(A.trunc.default(A.add.Scalar(center, 0.5 + support)), float(n_in))
    inside = A.logical_and.default(A.ge.Tensor(j, low), A.lt.Tensor(j, high))
    t = A.mul.Scalar(A.add.Scalar(A.sub.Tensor(j, center), 0.5), invscale)
    w = A.where.self(inside, A.clamp_min.default(A.rsub.Scalar(A.abs.default(t), 1.0), 0.0), A.zeros_like.default(t))
    total = A.sum.dim_IntList(w, [1], True)
    w = A.where.self(A.ne.Scalar(total, 0.0), A.div.Tensor(w, total), w)
    return A._to_copy.default(w, dtype=dtype)


def _resized(x, output_size, align_corners, scale_h, scale_w):
    h, w = x.shape[-2], x.shape[-1]
    rows = _axis_weights(h, output_size[0], align_corners, scale_h, x.dtype)
    cols = _axis_weights(w, output_size[1], align_corners, scale_w, x.dtype)
    return A.matmul.default(A.matmul.default(rows, x), A.transpose.int(cols, 0, 1))


def _wrong_in_torchlib(x, output_size, align_corners, scales_h=None, scales_w=None) -> bool:
    explicit = scales_h is not None or scales_w is not None
    return (align_corners or explicit) and x.dim() == 4 and x.dtype.is_floating_point and static(*x.shape)


@only_when(_wrong_in_torchlib)
def upsample_bilinear2d_aa(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _resized(x, list(output_size), align_corners, scales_h, scales_w)


@only_when(lambda x, output_size, align_corners, scale_factors: x.dim() == 4 and static(*x.shape))
def upsample_bilinear2d_aa_vec(x, output_size, align_corners, scale_factors):
    """.vec as the .default call eager makes of it (the output size from the scale factors,
    which are then the scales): torchlib translates only .default, and the calls of it it gets
    wrong take the decomposition above."""
    if output_size is None:
        sh, sw = scale_factors
        size = [int(math.floor(x.shape[-2] * sh)), int(math.floor(x.shape[-1] * sw))]
        return A._upsample_bilinear2d_aa.default(x, size, align_corners, sh, sw)
    return A._upsample_bilinear2d_aa.default(x, list(output_size), align_corners, None, None)


DECOMPOSITIONS = {
    A._upsample_bilinear2d_aa.default: upsample_bilinear2d_aa,
    A._upsample_bilinear2d_aa.vec: upsample_bilinear2d_aa_vec,
}
