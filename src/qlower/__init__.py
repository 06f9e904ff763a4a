"""qlower: a quantization-aware compiler for PyTorch models."""

import logging as _logging


class _DropOptionalKernelNoise(_logging.Filter):
    """torchao logs a warning for each optional CUDA kernel library it cannot load, and torch
    warns about torchao's pytree registrations of its enums (KernelPreference,
    ScaleCalculationMode) whenever torchao is imported (by qlower or, later, by transformers);
    all noise on a CPU machine. (Noise during qlower's own calls: core/quiet.py.)"""

    def filter(self, record: _logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith("Failed to load") and "torchao" in msg) and not any(
            f"<enum '{name}'> is an Enum subclass" in msg for name in ("KernelPreference", "ScaleCalculationMode"))


for _name in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_name).addFilter(_DropOptionalKernelNoise())

from . import blockops  # noqa: E402
from .core.version import __version__  # noqa: E402
from .api import compile, export, quantize  # noqa: E402
from .generate import CompiledLM, compile_lm  # noqa: E402
from .capture import capture, load_pt2, save_pt2  # noqa: E402
from .errors import (ArtifactError, BackendError, CaptureError, InputError, NumericsError,  # noqa: E402
                     PassError, QlowerError, QuantizeError)
from .meta import QPARAMS_KEY, QParams  # noqa: E402
from .quantize import AccuracyTarget, Calibration, QuantConfig, SmoothQuant, WeightOnly  # noqa: E402
from .runtime import CompiledModule, load  # noqa: E402
from .report.verify import verify  # noqa: E402  (float vs quantized report: `qlower verify`)

__all__ = ["__version__", "blockops", "compile", "quantize", "export", "compile_lm", "CompiledLM",
           "load", "capture", "load_pt2", "save_pt2",
           "CompiledModule", "QuantConfig", "AccuracyTarget", "Calibration", "SmoothQuant", "WeightOnly", "verify",
           "QParams", "QPARAMS_KEY", "QlowerError", "CaptureError",
           "InputError", "QuantizeError", "NumericsError", "PassError", "BackendError", "ArtifactError"]
