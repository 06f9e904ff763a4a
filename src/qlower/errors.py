"""Typed errors. Every error qlower raises on bad input is a `QlowerError`: a one-line cause,
a hint, and where known the node / op schema / source location it concerns."""
from __future__ import annotations


class QlowerError(Exception):
    """Base class. `str(err)` is `cause` plus, when given, location and hint lines."""

    def __init__(self, cause: str, *, hint: str | None = None, node: str | None = None,
                 schema: str | None = None, source: str | None = None):
        self.cause, self.hint, self.node, self.schema, self.source = cause, hint, node, schema, source
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [self.cause]
        for label, value in (("node", self.node), ("schema", self.schema),
                             ("source", self.source), ("hint", self.hint)):
            if value:
                lines.append(f"  {label}: {value}")
        return "\n".join(lines)


class CaptureError(QlowerError):
    """torch.export could not capture the model."""


class InputError(QlowerError):
    """Inputs given at call/compile time do not match what the model was compiled for."""


class QuantizeError(QlowerError):
    """Quantization was requested but cannot proceed (no calibration data, bad config)."""


class NumericsError(QlowerError):
    """A value cannot be represented under the canonical numerics (e.g. bias overflows int32)."""


class PassError(QlowerError):
    """A pass broke a graph invariant (caught by the pass manager's verifier)."""


class BackendError(QlowerError):
    """A backend could not compile or run a cluster."""


class ArtifactError(QlowerError):
    """A saved artifact is missing, corrupt or from an incompatible version."""


class NonFiniteInputError(InputError):
    """A float input holds NaN/inf and the compiled model was asked to refuse them
    (nan_policy="raise"): quantization maps NaN to a finite integer, so the output would look
    ordinary."""


class NonFiniteInputWarning(RuntimeWarning):
    """Warned once per compiled model (nan_policy="warn", the default) when a float input of a
    quantized model holds NaN/inf."""
