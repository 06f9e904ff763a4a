"""Running a compiled cluster with iree.runtime, falling back to PyTorch when a run fails."""
from __future__ import annotations

import logging
import os

import numpy as np
import torch
from torch.fx import GraphModule

from ..clusters import nonfinite_positions, pytorch_graph, run_in_pytorch, tell_policy, worst_abs_diff
from ...report import ClusterInfo
from .vm import IreeFunction, load_function, runtime_config  # noqa: F401  (the runner's API)

log = logging.getLogger("qlower.iree")
CHECK_ENV = "QLOWER_CHECK_CLUSTERS"   # "1": run each cluster in PyTorch too, record worst diff


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """uint8 goes in as its bytes viewed as int8: the emitted module takes signless i8."""
    if t.requires_grad:
        t = t.detach()
    a = (t if t.is_contiguous() else t.contiguous()).numpy()
    return a.view(np.int8) if a.dtype == np.uint8 else a


def _to_torch(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A result (already a copy, IreeFunction) as `dtype`: uint8 comes back as signless i8."""
    if dtype == torch.uint8:
        a = a.view(np.uint8)
    elif dtype == torch.bool and a.dtype != np.bool_:
        a = a.astype(np.bool_)
    return torch.from_numpy(a)


class IreeCluster(torch.nn.Module):
    """One cluster: its IREE function, and its FX subgraph (constants bound inside it) as the
    PyTorch fallback. Called with the cluster's runtime inputs only."""

    def __init__(self, fallback: GraphModule, function, output_dtypes: list[torch.dtype], single: bool,
                 info: ClusterInfo, kind: str, mlir: str | None, vmfb: bytes | None = None,
                 command: str | None = None, finite_checks: dict[int, str] | None = None,
                 driver: str = "local-sync"):
        super().__init__()
        self.fallback = fallback   # what the engine was given
        self.in_pytorch = pytorch_graph(fallback)   # block ops an engine lacked called again
        self.function = function
        self.output_dtypes = output_dtypes
        self.single_output = single
        self.info = info
        self.kind = kind          # "tosa" | "torch"
        self.mlir = mlir          # the module compiled (`qlower.export(format="mlir")`), for inspection and docs
        self.vmfb = vmfb          # what iree-compile made of it (`format="vmfb"`)
        self.command = command    # the iree-compile command line that made it from `mlir`
        self.driver = driver      # the iree-runtime driver (device) it runs on
        self.check = os.environ.get(CHECK_ENV) == "1"
        # runtime position -> graph input name (None: not a graph input): float32 inputs summed
        # here on the arrays handed to IREE; NaN/inf in one runs the call in PyTorch
        # (clusters.float_inputs says why), and the NaN policy hears of the graph inputs
        self.finite_checks = finite_checks or {}
        self.on_nonfinite = None   # handler(name, tensor), installed by the CompiledModule

    def _pytorch(self, args):
        return run_in_pytorch(self.in_pytorch, args)

    def forward(self, *args):
        if self.function is None:
            if self.finite_checks and self.on_nonfinite is not None:
                arrays = {pos: _to_numpy(args[pos]) for pos in self.finite_checks}
                tell_policy(self.on_nonfinite, self.finite_checks, args, self._nonfinite(args, arrays))
            return self._pytorch(args)
        try:
            arrays = [_to_numpy(a) for a in args]
        except Exception as exc:  # noqa: BLE001  (a tensor numpy cannot hold: PyTorch from now on)
            return self._fall_back(exc, args)
        if self.finite_checks:   # outside the try: NonFiniteInputError is the caller's, not a run failure
            bad = self._nonfinite(args, dict(enumerate(arrays)))
            if bad:
                tell_policy(self.on_nonfinite, self.finite_checks, args, bad)
                self.info.nonfinite_calls = (self.info.nonfinite_calls or 0) + 1
                return self._pytorch(args)
        try:
            outs = self.function(*arrays)
        except Exception as exc:  # noqa: BLE001  (any runtime failure)
            return self._fall_back(exc, args)
        result = tuple(_to_torch(o, d) for o, d in zip(outs, self.output_dtypes))
        result = result[0] if self.single_output else result
        if self.check:
            self._compare(result, self._pytorch(args))
        return result

    def _fall_back(self, exc: Exception, args):
        """Record the failure, warn once, run in PyTorch from now on."""
        self.function = None
        self.info.status, self.info.reason = "fallback", f"run failed: {str(exc).splitlines()[0][:200]}"
        log.warning("cluster #%d fell back to PyTorch: %s", self.info.id, self.info.reason)
        return self._pytorch(args)

    def _nonfinite(self, args, arrays) -> list[int]:
        """The checked positions holding NaN/inf, from each array's max - min in Python floats
        (NaN/inf propagate into it; no float32 arithmetic, so nothing overflows and numpy never
        warns). Measured hot: 1.8 us for a 1x16x64 input, 4.0 us for 8x3x32x32 (a float64-
        accumulated sum 1.3 / 10.9 us, and it warns on inf - inf); on the zoo transformer at
        batch 1 (1 thread, Intel Xeon AMX, 44-46 us calls) a float32 np.add.reduce under
        np.errstate had cost +4.7 us per call; torch's sum after an IREE call ~3x numpy's (the
        call evicts torch's dispatch code from the caches)."""
        values = []
        for pos in self.finite_checks:
            a = arrays[pos]
            values.append(float(np.maximum.reduce(a, axis=None)) - float(np.minimum.reduce(a, axis=None))
                          if a.size else 0.0)
        return nonfinite_positions(args, self.finite_checks, values)

    def _compare(self, got, want) -> None:
        self.info.max_abs_diff = max(self.info.max_abs_diff or 0.0, worst_abs_diff(got, want))
