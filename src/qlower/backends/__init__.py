"""Backends, one per folder. `get_backend(name)` resolves "auto" to the best available one."""
from __future__ import annotations

from ..errors import BackendError
from .base import Backend, Executable, op_counts
from .iree import IreeBackend
from .onnxruntime import OnnxRuntimeBackend
from .openvino import OpenVinoBackend
from .reference import ReferenceBackend

_BACKENDS = {"reference": ReferenceBackend, "onnxruntime": OnnxRuntimeBackend, "iree": IreeBackend,
             "openvino": OpenVinoBackend}
# Preference order for backend="auto": the first available wins.
AUTO_ORDER = ("onnxruntime", "reference")


def _make(name: str, options):
    from .onnxruntime import OrtOptions
    if name == "onnxruntime":
        if options is not None and not isinstance(options, OrtOptions):
            raise BackendError(f"backend_options for onnxruntime must be OrtOptions, got {type(options).__name__}")
        return OnnxRuntimeBackend(options)
    if name == "iree":
        from .iree import IreeOptions
        if options is not None and not isinstance(options, IreeOptions):
            raise BackendError(f"backend_options for iree must be IreeOptions, got {type(options).__name__}")
        return IreeBackend(options)
    if name == "openvino":
        from .openvino import OvOptions
        if options is not None and not isinstance(options, OvOptions):
            raise BackendError(f"backend_options for openvino must be OvOptions, got {type(options).__name__}")
        return OpenVinoBackend(options)
    return _BACKENDS[name]()


def backend_names() -> list[str]:
    return list(_BACKENDS)


def get_backend(name: str, options=None) -> Backend:
    """The backend called `name` ("auto": the first available in AUTO_ORDER). `options` is the
    backend's options dataclass (e.g. OrtOptions) and is passed only to the backend it belongs to."""
    if name == "auto":
        for candidate in AUTO_ORDER:
            backend = _make(candidate, options)
            if backend.available():
                return backend
    if name not in _BACKENDS:
        raise BackendError(f"unknown backend {name!r}", hint=f"use 'auto' or one of {backend_names()}")
    backend = _make(name, options)
    if not backend.available():
        raise BackendError(f"backend {name!r} is not available on this machine",
                           hint=getattr(backend, "install_hint", None))
    return backend


__all__ = ["Backend", "Executable", "get_backend", "backend_names", "op_counts", "AUTO_ORDER"]
