"""Backends, one per folder, found by name through `registry.py` (imported when used).
`compile(backend="auto")` measures candidates: that is engine_choice.py, above the backends."""
from .base import Backend, Executable, op_counts
from .registry import (AUTO_ORDER, EXPORT_FORMATS, REGISTRY, backend_class, backend_names, get_backend,
                       make_backend, options_backend)

__all__ = ["Backend", "Executable", "op_counts", "AUTO_ORDER", "EXPORT_FORMATS", "REGISTRY", "backend_class",
           "backend_names", "get_backend", "make_backend", "options_backend"]
