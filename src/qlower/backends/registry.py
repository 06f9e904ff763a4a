"""The backends by name: one line per backend, its module imported only when it is used.

A new backend is one folder under backends/ (a class implementing the `Backend` protocol of
base.py, and its options dataclass if it has options) plus one line in `REGISTRY`. `compile`,
`load`, `qlower export`, the bench and the CLI all resolve names here, so an optional engine
(openvino, iree) is never imported by a run that does not ask for it.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..errors import BackendError
from .base import Backend


@dataclass(frozen=True)
class Entry:
    module: str                          # imported on first use
    backend: str                         # the Backend class in that module
    options: str | None = None           # its options dataclass, if it takes options
    export_formats: tuple[str, ...] = ()  # qlower.export formats it writes (its `export(cm, path, format)`)
    cls: type | None = None              # a class given directly (a backend defined outside qlower)

    @classmethod
    def of(cls, backend: type) -> Entry:
        """An entry for a Backend class that takes no options, registered as is."""
        return cls(module=backend.__module__, backend=backend.__name__, cls=backend)

    def load(self) -> type:
        return self.cls or getattr(importlib.import_module(self.module), self.backend)


REGISTRY: dict[str, Entry] = {
    "reference": Entry("qlower.backends.reference", "ReferenceBackend"),
    "onnxruntime": Entry("qlower.backends.onnxruntime", "OnnxRuntimeBackend", "OrtOptions", ("onnx",)),
    "iree": Entry("qlower.backends.iree", "IreeBackend", "IreeOptions", ("mlir", "vmfb")),
    "openvino": Entry("qlower.backends.openvino", "OpenVinoBackend", "OvOptions"),
}
# Preference order where "auto" is resolved without measuring (get_backend("auto"),
# quantize(backend="auto")): the first available wins. compile(backend="auto") measures
# engine_choice.AUTO_CANDIDATES instead.
AUTO_ORDER = ("onnxruntime", "reference")
# qlower.export's engine formats -> the backend that writes them
EXPORT_FORMATS = {f: name for name, entry in REGISTRY.items() for f in entry.export_formats}


def backend_names() -> list[str]:
    return list(REGISTRY)


def backend_class(name: str) -> type:
    return REGISTRY[name].load()


def _belongs(options, entry: Entry) -> bool:
    """`options` is an instance of `entry`'s options class (decided from its class, importing
    nothing)."""
    cls = type(options)
    return entry.options == cls.__name__ and (cls.__module__ == entry.module
                                              or cls.__module__.startswith(entry.module + "."))


def options_backend(options) -> str | None:
    """The backend an options object belongs to (OrtOptions -> "onnxruntime"), None for None;
    a BackendError for anything else."""
    if options is None:
        return None
    for name, entry in REGISTRY.items():
        if _belongs(options, entry):
            return name
    known = ", ".join(e.options for e in REGISTRY.values() if e.options)
    raise BackendError(f"backend_options must be one of {known}, got {type(options).__name__}")


def make_backend(name: str, options=None) -> Backend:
    """An instance of backend `name` with `options` (which must be that backend's)."""
    if options is not None and not _belongs(options, REGISTRY[name]):
        raise BackendError(f"backend_options for {name} must be {REGISTRY[name].options or 'None'}, "
                           f"got {type(options).__name__}")
    cls = backend_class(name)
    return cls(options) if REGISTRY[name].options else cls()


def get_backend(name: str, options=None) -> Backend:
    """The backend called `name` ("auto": the first available in AUTO_ORDER, not measured). `options` is the
    backend's options dataclass (e.g. OrtOptions) and is passed only to the backend it belongs to."""
    if not isinstance(name, str):
        raise BackendError(f"a backend name must be a string, got {type(name).__name__}",
                           hint=f"use 'auto' or one of {backend_names()}")
    if name == "auto":
        for candidate in AUTO_ORDER:
            backend = make_backend(candidate, options)
            if backend.available():
                return backend
    if name not in REGISTRY:
        raise BackendError(f"unknown backend {name!r}", hint=f"use 'auto' or one of {backend_names()}")
    backend = make_backend(name, options)
    if not backend.available():
        raise BackendError(f"backend {name!r} is not available on this machine",
                           hint=getattr(backend, "install_hint", None))
    return backend
