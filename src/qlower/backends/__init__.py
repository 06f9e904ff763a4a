"""Backends, one per folder. `get_backend(name)` resolves "auto" to the preferred available one
without measuring; `compile(backend="auto")` measures the candidates (`auto_backends`, select.py)."""
from __future__ import annotations

from ..errors import BackendError
from .base import Backend, Executable, op_counts
from .iree import IreeBackend
from .onnxruntime import OnnxRuntimeBackend
from .openvino import OpenVinoBackend
from .reference import ReferenceBackend
from .select import AUTO_CANDIDATES, AutoSettings, EngineSelector, default_selector

_BACKENDS = {"reference": ReferenceBackend, "onnxruntime": OnnxRuntimeBackend, "iree": IreeBackend,
             "openvino": OpenVinoBackend}
# Preference order where "auto" is resolved without measuring (get_backend("auto"),
# quantize(backend="auto")): the first available wins. compile(backend="auto") measures
# select.AUTO_CANDIDATES instead (docs/architecture.md, "Engine choice").
AUTO_ORDER = ("onnxruntime", "reference")
# qlower.export's engine formats -> the backend that writes them (its `export(cm, path, format)`)
EXPORT_FORMATS = {f: name for name, cls in _BACKENDS.items() for f in getattr(cls, "export_formats", ())}
_OPTION_TYPES = {"onnxruntime": ("onnxruntime", "OrtOptions"), "iree": ("iree", "IreeOptions"),
                 "openvino": ("openvino", "OvOptions")}


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


def options_backend(options) -> str | None:
    """The backend an options object belongs to (OrtOptions -> "onnxruntime"), None for None;
    a BackendError for anything else."""
    if options is None:
        return None
    import importlib
    for name, (module, cls) in _OPTION_TYPES.items():
        if isinstance(options, getattr(importlib.import_module(f"{__name__}.{module}"), cls)):
            return name
    raise BackendError(f"backend_options must be OrtOptions, OvOptions or IreeOptions, got {type(options).__name__}")


def auto_backends(names, options=None) -> tuple[list[Backend], str | None]:
    """(backends, why not measured) for compile(backend="auto"): the available ones among
    `names` (validated, in order) plus the reference backend (the oracle and fallback, last).
    `options` go to the backend they belong to; the others get their defaults. The second item
    says why there is nothing to measure (fewer than two engines), else None."""
    owner = options_backend(options)
    if owner is not None and owner not in names:
        raise BackendError(f"backend_options are for {owner!r}, which is not an auto candidate {list(names)}",
                           hint=f"compile with backend={owner!r}, or add it to the candidates")
    made = [_make(n, options if n == owner else None) for n in names if n != "reference"]
    available = [b for b in made if b.available()]
    missing = [b.name for b in made if not b.available()]
    why = None
    if len(available) < 2:
        why = ("the only candidate" if available else "no candidate engine") + \
            (f" among {list(names)}" if tuple(names) != AUTO_CANDIDATES else " installed") + \
            (f" ({', '.join(missing)} not installed)" if missing else "")
    return available + [ReferenceBackend()], why


def get_backend(name: str, options=None) -> Backend:
    """The backend called `name` ("auto": the first available in AUTO_ORDER, not measured). `options` is the
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


__all__ = ["Backend", "Executable", "get_backend", "backend_names", "op_counts", "AUTO_ORDER", "AUTO_CANDIDATES",
           "AutoSettings", "EngineSelector", "auto_backends", "default_selector", "options_backend"]
