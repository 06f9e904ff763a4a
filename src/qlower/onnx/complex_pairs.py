"""Decompositions for complex tensors, written on their (real, imaginary) pairs. torch.onnx
represents a complex tensor as float pairs (a trailing dim of 2) and registers complex
translations apart from real ones; for the ops below torchlib has only the real one, and the
exporter refuses a complex call of it. Each is the same op on `view_as_real(z)` with the pair dim
kept last (dims normalized to non-negative, so -1 still means z's last dim), then
`view_as_complex`: bit for bit, shapes only move. Real calls keep torchlib's translation
(`only_when`), and qlower's other decompositions leave complex calls alone
(`conditional.for_real_tensors`). Tested in tests/test_decompositions.py and tests/test_complex.py."""
from __future__ import annotations

import torch

from .complex_values import is_complex
from .conditional import for_complex, only_when

A = torch.ops.aten


def _complex(x, *args, **kwargs) -> bool:
    return is_complex(x)


def _pairs(z):
    return A.view_as_real.default(z)


def _complex_of(pairs):
    return A.view_as_complex.default(pairs)


def _on_pairs(fn):
    """A decomposition of a complex call: fn(pairs, z, *args) -> pairs."""
    return for_complex(only_when(_complex)(lambda z, *args, **kwargs: _complex_of(fn(_pairs(z), z, *args, **kwargs))))


@for_complex
@only_when(lambda x, pad, value=0: _complex(x) and value == 0)
def _constant_pad(x, pad, value=0):
    """Zero padding (fft2 / fftn with sizes beyond the input's); the pair dim is not padded."""
    return _complex_of(A.constant_pad_nd.default(_pairs(x), [0, 0, *pad], 0.0))


@for_complex
@only_when(_complex)
def _conj_physical(x):
    """The conjugate (ihfft2 / ihfftn): the imaginary half of each pair negated."""
    pairs = _pairs(x)
    return _complex_of(A.stack.default([A.select.int(pairs, -1, 0), A.neg.default(A.select.int(pairs, -1, 1))], -1))


@for_complex
@only_when(_complex)
def _split(z, split_size, dim=0):
    return [_complex_of(p) for p in A.split.Tensor(_pairs(z), split_size, dim % z.dim())]


@for_complex
@only_when(lambda a, b: _complex(a) or _complex(b))
def _product(a, b):
    """mm / bmm: torchlib's complex matmul (the product of the pairs as complex numbers)."""
    return A.matmul.default(a, b)


@for_complex
@only_when(_complex)
def _same(z, *args, **kwargs):
    """alias / detach / contiguous / clone-like identities."""
    return _complex_of(_pairs(z))


DECOMPOSITIONS = {
    A.constant_pad_nd.default: _constant_pad,
    A._conj_physical.default: _conj_physical,
    A.reshape.default: _on_pairs(lambda p, z, shape: A.reshape.default(p, [*shape, 2])),
    A.expand.default: _on_pairs(lambda p, z, size, implicit=False: A.expand.default(p, [*size, 2])),
    A.select.int: _on_pairs(lambda p, z, dim, index: A.select.int(p, dim % z.dim(), index)),
    A.unsqueeze.default: _on_pairs(lambda p, z, dim: A.unsqueeze.default(p, dim % (z.dim() + 1))),
    A.flatten.using_ints: _on_pairs(lambda p, z, start=0, end=-1: A.flatten.using_ints(
        p, start % max(z.dim(), 1), end % max(z.dim(), 1))),
    A.index.Tensor: _on_pairs(lambda p, z, indices: A.index.Tensor(p, indices)),
    A.split.Tensor: _split,
    A.mm.default: _product,
    A.bmm.default: _product,
    A.alias.default: _same,
    A.detach.default: _same,
    A.contiguous.default: _same,
}
