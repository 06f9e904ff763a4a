"""Conditional decompositions: an entry of the exporter's decomposition table that applies to
some calls of an op only. The others return NotImplemented, which keeps the op as torchlib
translates it (or, for an op torchlib has no translation for, in PyTorch, with its reason)."""
from __future__ import annotations

import functools


def only_when(applies, *, otherwise_torch: bool = False):
    """A decomposition for the calls `applies(*args, **kwargs)` picks; the op's other calls return
    NotImplemented, which keeps the op itself (torchlib translates those), and cost no re-trace
    (`translate._needs_decomposition` asks `decompositions.decomposes`). `otherwise_torch`: the
    other calls take torch's own decomposition of the op instead (a CompositeImplicit op such as
    linalg.matrix_norm, whose other orders torch decomposes into translatable ops)."""
    def wrap(fn):
        @functools.wraps(fn)
        def decomposition(*args, **kwargs):
            return fn(*args, **kwargs) if applies(*args, **kwargs) else NotImplemented
        decomposition.applies = applies
        decomposition.otherwise_torch = otherwise_torch
        return decomposition
    return wrap


def applies_to(decomposition):
    """The predicate of an `only_when` decomposition (None: it always applies)."""
    return getattr(decomposition, "applies", None)


def static(*sizes) -> bool:
    """Every size a Python int (no symbolic dim)."""
    return all(isinstance(s, int) for s in sizes)
