"""segment_reduce for ONNX Runtime, written in ATen ops torchlib translates (torchlib has no
translation: OpInfo's _segment_reduce.lengths / .offsets ran in PyTorch).

Each segment k holds positions offsets[k] <= i < offsets[k + 1] of axis 0 (offsets given, or
the running sum of lengths from 0): a (K, N) membership mask, and each reduction over the
masked values. Eager's rules: `initial` joins every segment's reduction (sum: added, prod:
multiplied, max / min: compared; mean: added to the sum, then divided by the count), and an empty
segment is `initial`, else the reduction's identity (0, 1, -inf, inf) or NaN for mean.
Axis 0, one-dimensional lengths / offsets, static sizes, data not empty; other calls stay in PyTorch.
"""
from __future__ import annotations

import math

import torch

from .conditional import only_when, static

A = torch.ops.aten
_IDENTITY = {"sum": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf, "mean": 0.0}


def _applies(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None) -> bool:
    bounds = offsets if offsets is not None else lengths
    return (bounds is not None and indices is None and axis == 0 and bounds.dim() == 1 and reduce in _IDENTITY
            and data.dim() >= 1 and data.dtype.is_floating_point and static(*data.shape, *bounds.shape)
            and data.shape[0] > 0)


@only_when(_applies)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    if offsets is None:
        zero = A.zeros.default([1], dtype=lengths.dtype)
        offsets = A.cat.default([zero, A.cumsum.default(lengths, 0)])
    k = offsets.shape[0] - 1
    n = data.shape[0]
    position = A.arange.default(n, dtype=offsets.dtype)
    starts = A.unsqueeze.default(A.slice.Tensor(offsets, 0, 0, k), 1)
    ends = A.unsqueeze.default(A.slice.Tensor(offsets, 0, 1, k + 1), 1)
    member = A.logical_and.default(A.ge.Tensor(position, starts), A.lt.Tensor(position, ends))   # (K, N)
    member = A.reshape.default(member, [k, n] + [1] * (data.dim() - 1))
    rows = A.unsqueeze.default(data, 0)                                                           # (1, N, ...)
    identity = A.full.default([], _IDENTITY[reduce], dtype=data.dtype)
    masked = A.where.self(member, rows, identity)
    if reduce in ("sum", "mean"):
        value = A.sum.dim_IntList(masked, [1])
    elif reduce == "prod":
        value = A.prod.dim_int(masked, 1)
    else:
        value = (A.amax if reduce == "max" else A.amin).default(masked, [1])
    if initial is not None:
        join = {"sum": A.add.Scalar, "mean": A.add.Scalar, "prod": A.mul.Scalar,
                "max": A.clamp_min.default, "min": A.clamp_max.default}[reduce]
        value = join(value, initial)
    if reduce != "mean":
        return value
    count = A.sum.dim_IntList(A._to_copy.default(member, dtype=data.dtype), [1])
    mean = A.div.Tensor(value, count)
    if initial is None:
        return mean   # 0 / 0: NaN for an empty segment, as eager
    return A.where.self(A.eq.Scalar(count, 0), A.full.default([], initial, dtype=data.dtype), mean)


DECOMPOSITIONS = {A.segment_reduce.default: segment_reduce}
