"""Backend options in an artifact: which fields a file may set, and to what.

A saved file is data, so the options it carries are limited to an allow-list of fields with
checked values (types, ranges, enums). Free-form strings that reach a compiler, a linker or a
shell are never taken from a file: IreeOptions.extra_flags is not saved, and a file that sets
it (or any field outside the list) is refused. Whoever loads the file passes such options
themselves: `qlower.load(path, backend_options=IreeOptions(extra_flags=(...)))`.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from ..errors import ArtifactError
from ..onnx.lowering.weight_only import COMPUTE_LEVELS

_NAME = re.compile(r"[A-Za-z0-9_.+\-]{1,64}")          # a CPU / GPU architecture name
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # an ONNX Runtime optimizer name


def _int(lo: int, hi: int) -> Callable:
    def check(v):
        if type(v) is not int or not lo <= v <= hi:
            return f"an integer in [{lo}, {hi}]"
        return None
    return check


def _bool(v):
    return None if type(v) is bool else "true or false"


def _one_of(*choices) -> Callable:
    def check(v):
        return None if isinstance(v, str) and v in choices else f"one of {list(choices)}"
    return check


def _pattern(pattern: re.Pattern, what: str, empty: bool = False) -> Callable:
    def check(v):
        if isinstance(v, str) and ((empty and v == "") or pattern.fullmatch(v)):
            return None
        return what
    return check


def _names(v):
    if not isinstance(v, (list, tuple)) or len(v) > 64 or not all(isinstance(s, str) and _IDENTIFIER.fullmatch(s)
                                                                   for s in v):
        return "a list of at most 64 identifiers"
    return None


def _iree_fields() -> dict[str, Callable]:
    return {"target_backend": _one_of("llvm-cpu", "cuda", "rocm", "vulkan-spirv"),
            "target_cpu": _pattern(_NAME, "a CPU name ([A-Za-z0-9_.+-], at most 64 characters)"),
            "data_tiling": _bool,
            "data_tiling_path": _one_of("auto", "dispatch", "global"),
            "im2col_convs": _bool,
            "conv_im2col": _bool,
            "driver": _one_of("", "local-sync", "local-task", "cuda", "hip", "vulkan"),
            "target_gpu": _pattern(_NAME, "a GPU architecture name ([A-Za-z0-9_.+-], at most 64 characters)",
                                   empty=True),
            "ukernels": _one_of("auto", "default", "all", "none", "mmt4d"),
            "min_cluster_size": _int(0, 1 << 20),
            "weight_only_dequantize": _one_of("load", "call")}


def _ort_fields() -> dict[str, Callable]:
    return {"threads": _int(0, 4096),
            "optimization": _one_of("disabled", "basic", "extended", "all"),
            "disabled_optimizers": _names,
            "min_cluster_size": _int(0, 1 << 20),
            "weight_only_compute": _one_of(*COMPUTE_LEVELS)}


def _ov_fields() -> dict[str, Callable]:
    return {"threads": _int(0, 4096),
            "inference_precision": _one_of("f32", "bf16", "f16"),
            "performance_hint": _one_of("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"),
            "min_cluster_size": _int(0, 1 << 20),
            "numerics": _one_of("canonical", "openvino")}


# options class -> the fields a file may set, each with its check
ALLOWED_FIELDS: dict[str, Callable[[], dict[str, Callable]]] = {
    "IreeOptions": _iree_fields, "OrtOptions": _ort_fields, "OvOptions": _ov_fields}


def to_json(options) -> dict | None:
    """The allow-listed fields of `options` (what save writes); fields outside the list are not
    saved, their names are listed under "withheld" when they differ from the defaults."""
    if options is None:
        return None
    if not dataclasses.is_dataclass(options):
        raise ArtifactError(f"backend options of type {type(options).__name__} cannot be saved",
                            hint="backend options are dataclasses such as OrtOptions")
    name = type(options).__qualname__
    allowed = ALLOWED_FIELDS[name]() if name in ALLOWED_FIELDS else {}
    fields, withheld = {}, []
    for field in dataclasses.fields(options):
        value = getattr(options, field.name)
        if field.name in allowed:
            fields[field.name] = list(value) if isinstance(value, tuple) else value
        elif value != _default(field):
            withheld.append(field.name)
    out = {"class": name, "fields": fields}
    if withheld:
        out["withheld"] = withheld
    return out


def _default(field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def from_json(data, cls, path) -> tuple[object | None, list[str]]:
    """(options of class `cls` rebuilt from the file's allow-listed fields, the names of fields
    the saver withheld). Any other field, or a value outside its check, is an ArtifactError
    naming the field."""
    if data is None:
        return None, []
    where = "part 'extra/qlower.json'"
    if not isinstance(data, dict) or set(data) - {"class", "fields", "withheld"}:
        raise ArtifactError(f"{path}: backend_options in {where} is malformed",
                            hint="the artifact's metadata was modified; re-save it from the source model")
    if cls is None or data.get("class") != cls.__qualname__ or cls.__qualname__ not in ALLOWED_FIELDS:
        raise ArtifactError(f"{path}: saved backend options {str(data.get('class'))[:40]!r} ({where}) do not "
                            "belong to the artifact's backend", hint="the artifact's metadata was modified")
    allowed = ALLOWED_FIELDS[cls.__qualname__]()
    fields = data.get("fields")
    if not isinstance(fields, dict):
        raise ArtifactError(f"{path}: backend_options.fields in {where} is not a mapping",
                            hint="the artifact's metadata was modified")
    for name, value in fields.items():
        if name not in allowed:
            raise ArtifactError(
                f"{path}: backend option {cls.__qualname__}.{str(name)[:40]} in {where} is never taken from a "
                "file (compiler flags and paths come from whoever loads it)",
                hint=f"pass it yourself: qlower.load(path, backend_options={cls.__qualname__}(...))")
        why = allowed[name](value)
        if why:
            raise ArtifactError(f"{path}: backend option {cls.__qualname__}.{name} in {where} is "
                                f"{str(value)[:60]!r}; it must be {why}", hint="the artifact's metadata was modified")
    withheld = data.get("withheld", [])
    known = {f.name for f in dataclasses.fields(cls)} - set(allowed)
    if not isinstance(withheld, list) or not all(isinstance(w, str) and w in known for w in withheld):
        raise ArtifactError(f"{path}: backend_options.withheld in {where} is malformed",
                            hint="the artifact's metadata was modified")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    try:
        return cls(**values), withheld
    except Exception as exc:   # the class's own checks (BackendError, TypeError)
        raise ArtifactError(f"{path}: saved backend options ({where}) are refused by {cls.__qualname__}: "
                            f"{str(exc)[:200]}", hint="the artifact's metadata was modified") from exc
