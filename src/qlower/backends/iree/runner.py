"""Running a compiled cluster with iree.runtime, falling back to PyTorch when a run fails."""
from __future__ import annotations

import logging

import numpy as np
import torch
from torch.fx import GraphModule

from ..clusters import nonfinite_positions, pytorch_graph, run_in_pytorch, tell_policy, worst_abs_diff
from ...core.settings import settings
from ...core.types import ClusterInfo
from .vm import ZERO_COPY_ALIGNMENT, IreeFunction, load_function, runtime_config  # noqa: F401  (the runner's API)

log = logging.getLogger("qlower.iree")


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """uint8 goes in as its bytes viewed as int8: the emitted module takes signless i8."""
    if t.requires_grad:
        t = t.detach()
    a = (t if t.is_contiguous() else t.contiguous()).numpy()
    return a.view(np.int8) if a.dtype == np.uint8 else a


def _to_torch(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A result (already a copy, IreeFunction) as `dtype`: uint8 comes back as signless i8."""
    return _as_dtype(torch.from_numpy(a), dtype)


# dtypes handed to IREE in place (DLPack); uint8 goes as its bytes viewed as int8 (signless i8)
_ZERO_COPY_DTYPES = (torch.float32, torch.int8, torch.uint8, torch.int32, torch.int64)


def _in_place(t) -> torch.Tensor | None:
    """`t` as IREE can read it in place (IreeFunction.call_zero_copy), or None: a dense CPU
    tensor of a dtype the module takes, not empty, aligned as IREE's host-memory import needs
    (torch allocates so; numpy arrays and views into a tensor may not be)."""
    if not isinstance(t, torch.Tensor) or t.dtype not in _ZERO_COPY_DTYPES or t.device.type != "cpu" \
            or not t.is_contiguous() or t.numel() == 0 or t.data_ptr() % ZERO_COPY_ALIGNMENT:
        return None
    t = t.detach()
    return t.view(torch.int8) if t.dtype == torch.uint8 else t


def _as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A result (IREE's signless integers come back signed) as the graph's dtype."""
    if t.dtype == dtype:
        return t
    if dtype == torch.uint8 and t.dtype == torch.int8:
        return t.view(torch.uint8)
    return t != 0 if dtype == torch.bool else t.to(dtype)


def _aliases(result: torch.Tensor, inputs) -> bool:
    """`result`'s memory lies in one of the inputs' (a module that returns an input as it is)."""
    start = result.data_ptr()
    return any(t.data_ptr() <= start < t.data_ptr() + t.numel() * t.element_size() for t in inputs)


class IreeCluster(torch.nn.Module):
    """One cluster: its IREE function, and its FX subgraph (constants bound inside it) as the
    PyTorch fallback. Called with the cluster's runtime inputs only."""

    def __init__(self, fallback: GraphModule, function, output_dtypes: list[torch.dtype], single: bool,
                 info: ClusterInfo, kind: str, mlir: str | None, vmfb: bytes | None = None,
                 command: str | None = None, finite_checks: dict[int, str] | None = None,
                 driver: str = "local-sync", engine_sums: bool = False, argument_check=None):
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
        self.check = settings().check_clusters
        # runtime position -> graph input name (None: not a graph input): float32 inputs summed
        # here on the arrays handed to IREE; NaN/inf in one runs the call in PyTorch
        # (clusters.float_inputs says why), and the NaN policy hears of the graph inputs
        self.finite_checks = finite_checks or {}
        # True: `function` is the module's CHECKED_ENTRY, whose last results are the sums of the
        # checked inputs (computed in the engine); else they are checked here before the call
        self.engine_sums = engine_sums and bool(self.finite_checks)
        self.on_nonfinite = None   # handler(name, tensor), installed by the CompiledModule
        # argument_checks.ArgumentCheck (None: nothing to check): an index out of range or an
        # integer divisor of 0 among the arguments runs the call in PyTorch, which raises eager's
        # error (IREE would return a row, zeros or -9223372036854775807)
        self.argument_check = argument_check if argument_check is not None and argument_check.needed else None
        # inputs read in place and results handed over without copies (CPU drivers): off for
        # good after the first call it fails (then numpy copies, as on GPUs)
        self.zero_copy = hasattr(function, "call_zero_copy") and getattr(function, "_host_local", False)

    def _pytorch(self, args):
        return run_in_pytorch(self.in_pytorch, args)

    def forward(self, *args):
        if self.argument_check is not None and not self.argument_check(args):
            return self._pytorch(args)
        if self.function is None:
            if self.finite_checks and self.on_nonfinite is not None:
                arrays = {pos: _to_numpy(args[pos]) for pos in self.finite_checks}
                tell_policy(self.on_nonfinite, self.finite_checks, args, self._nonfinite(args, arrays))
            return self._pytorch(args)
        if self.zero_copy:
            in_place = [_in_place(a) for a in args]
            if all(t is not None for t in in_place):
                return self._run_in_place(args, in_place)
        try:
            arrays = [_to_numpy(a) for a in args]
        except Exception as exc:  # noqa: BLE001  (a tensor numpy cannot hold: PyTorch from now on)
            return self._fall_back(exc, args)
        if self.finite_checks and not self.engine_sums:   # outside the try: NonFiniteInputError is the caller's
            bad = self._nonfinite(args, dict(enumerate(arrays)))
            if bad:
                return self._nonfinite_call(args, bad)
        try:
            outs = self.function(*arrays)
        except Exception as exc:  # noqa: BLE001  (any runtime failure)
            return self._fall_back(exc, args)
        if self.engine_sums:
            outs, sums = self._split_sums(outs)
            bad = nonfinite_positions(args, self.finite_checks, [float(s[0]) for s in sums])
            if bad:
                return self._nonfinite_call(args, bad)
        return self._result([_to_torch(o, d) for o, d in zip(outs, self.output_dtypes)], args)

    def _split_sums(self, results: list) -> tuple[list, list]:
        """(the cluster's outputs, the engine's sums of the checked inputs)."""
        k = len(self.finite_checks)
        return results[:-k], results[-k:]

    def _run_in_place(self, args, in_place: list[torch.Tensor]):
        """One call with the inputs read in place and the results IREE's own buffers; a result
        that is an input's memory is copied (a caller must not get its input back as the
        output). A failure turns zero copy off and the call goes the copying way."""
        if self.finite_checks and not self.engine_sums:
            bad = self._nonfinite(args, {pos: in_place[pos].numpy() for pos in self.finite_checks})
            if bad:
                return self._nonfinite_call(args, bad)
        try:
            capsules = self.function.call_zero_copy(*in_place)
        except Exception as exc:  # noqa: BLE001  (an input IREE cannot import: copy from now on)
            log.info("cluster #%d: inputs are copied from now on (zero copy failed: %s)", self.info.id,
                     str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
            self.zero_copy = False
            return self.forward(*args)
        if self.engine_sums:
            capsules, sums = self._split_sums(capsules)
            bad = nonfinite_positions(args, self.finite_checks, [torch.from_dlpack(s).item() for s in sums])
            if bad:
                return self._nonfinite_call(args, bad)
        results = [_as_dtype(torch.from_dlpack(c), d) for c, d in zip(capsules, self.output_dtypes)]
        return self._result([r.clone() if _aliases(r, in_place) else r for r in results], args)

    def _result(self, outs: list[torch.Tensor], args):
        result = tuple(outs)
        result = result[0] if self.single_output else result
        if self.check:
            self._compare(result, self._pytorch(args))
        return result

    def _nonfinite_call(self, args, bad: list[int]):
        """A call whose checked inputs hold NaN/inf: the policy hears of it, PyTorch runs it."""
        tell_policy(self.on_nonfinite, self.finite_checks, args, bad)
        self.info.nonfinite_calls = (self.info.nonfinite_calls or 0) + 1
        return self._pytorch(args)

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
