"""Capture: `torch.export` with qlower's error reporting, and .pt2 load/save."""
from __future__ import annotations

import re
from pathlib import Path

import torch

from .errors import ArtifactError, CaptureError, InputError

_SOURCE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_OP_NAME = re.compile(r"\b((?:aten|qlower|prims|quantized_decomposed)::?\.?[\w.]+|torch\.ops\.[\w.]+)")


def check_example_inputs(example_inputs) -> tuple:
    """Normalise `example_inputs` to a tuple; a bare tensor is a common mistake worth a hint."""
    if isinstance(example_inputs, torch.Tensor):
        raise InputError("example_inputs must be a tuple of inputs, got a bare tensor",
                         hint="pass (x,) instead of x")
    if not isinstance(example_inputs, (tuple, list)):
        raise InputError(f"example_inputs must be a tuple, got {type(example_inputs).__name__}",
                         hint="pass the positional inputs of forward() as a tuple, e.g. (x,)")
    return tuple(example_inputs)


def check_module(model) -> None:
    if isinstance(model, torch.export.ExportedProgram):
        return
    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"expected a torch.nn.Module or ExportedProgram, got {type(model).__name__}",
                           hint="wrap plain functions in an nn.Module whose forward() calls them")


def _describe_export_failure(exc: BaseException) -> tuple[str, str | None, str | None]:
    """One-line cause, offending op and user source line extracted from torch's message."""
    text = str(exc)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    user_lines = [f"{f}:{ln}" for f, ln in _SOURCE_LINE.findall(text)
                  if "/torch/" not in f and "/site-packages/" not in f]
    ops = _OP_NAME.findall(text)
    return first[:300], (ops[0] if ops else None), (user_lines[-1] if user_lines else None)


def capture(model, example_inputs, dynamic_shapes=None, *, strict: bool = False
            ) -> torch.export.ExportedProgram:
    """torch.export the model (eval mode) into an ExportedProgram of core ATen + qlower ops.
    An ExportedProgram is returned unchanged."""
    check_module(model)
    if isinstance(model, torch.export.ExportedProgram):
        return model
    example_inputs = check_example_inputs(example_inputs)
    model.eval()
    try:
        return torch.export.export(model, example_inputs, dynamic_shapes=dynamic_shapes, strict=strict)
    except Exception as exc:  # torch raises many types; all mean "could not capture"
        cause, op, source = _describe_export_failure(exc)
        raise CaptureError(f"torch.export could not capture {type(model).__name__}: {cause}",
                           schema=op, source=source,
                           hint="rewrite the data-dependent / unsupported code path, or wrap it "
                                "in a torch.library custom op") from exc


def save_pt2(ep: torch.export.ExportedProgram, path: str | Path) -> Path:
    path = Path(path)
    torch.export.save(ep, str(path))
    return path


def load_pt2(path: str | Path) -> torch.export.ExportedProgram:
    from . import ops  # noqa: F401  (qlower ops must be registered before deserialising)
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"no such .pt2 file: {path}")
    try:
        return torch.export.load(str(path))
    except Exception as exc:
        raise ArtifactError(f"cannot load {path} as a torch.export program: {str(exc)[:200]}") from exc
