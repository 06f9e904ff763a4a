"""Ops whose output size depends on input values, written in ATen ops torchlib translates
(ONNX's NonZero sizes its output at run time; the rest follows from it): nonzero / argwhere of
a 0-d tensor (ONNX's NonZero of a scalar is (1, n), eager's (n, 0)) and masked_select, which
torchlib does not translate (OpInfo: masked_select, and combinations, built on it).
"""
from __future__ import annotations

import torch

from .conditional import only_when

A = torch.ops.aten


@only_when(lambda x: x.dim() == 0)
def nonzero_of_a_scalar(x):
    """(1, 0) where x is nonzero, (0, 0) where it is 0: NonZero of x as a vector, no column."""
    return A.slice.Tensor(A.nonzero.default(A.reshape.default(x, [1])), 1, 0, 0)


def argwhere(x):
    """nonzero (argwhere is its alias; torchlib registers only nonzero)."""
    return nonzero_of_a_scalar(x) if x.dim() == 0 else A.nonzero.default(x)


def masked_select(x, mask):
    """x's elements where mask is True, both broadcast to their common shape, in row-major order."""
    shape = list(torch.broadcast_shapes(x.shape, mask.shape))
    flat = lambda t: A.reshape.default(A.expand.default(t, shape), [-1])
    return A.index.Tensor(flat(x), [A.squeeze.dim(A.nonzero.default(flat(mask)), 1)])


DECOMPOSITIONS = {
    A.nonzero.default: nonzero_of_a_scalar,
    A.argwhere.default: argwhere,
    A.masked_select.default: masked_select,
}
