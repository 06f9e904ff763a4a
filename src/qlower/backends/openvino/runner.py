"""Compiling one ONNX model with OpenVINO's CPU plugin and running it, falling back to PyTorch
when a run fails. openvino is imported lazily (it is an optional extra)."""
from __future__ import annotations

import functools
import logging
import threading

import numpy as np
import torch
from torch.fx import GraphModule

from ...core.settings import settings
from ...errors import BackendError
from ..clusters import (as_numpy, as_scalars, nonfinite_positions, pytorch_graph, run_in_pytorch, scalar_kinds,
                        worst_abs_diff)
from ...core.types import ClusterInfo

log = logging.getLogger("qlower.openvino")
INSTALL_HINT = "pip install 'qlower[openvino]'  (or: pip install openvino==2026.4.1)"


@functools.lru_cache(maxsize=1)
def core():
    """The process's one openvino.Core (plugins load once)."""
    try:
        import openvino as ov
    except ImportError as exc:
        raise BackendError("the openvino backend needs the openvino package", hint=INSTALL_HINT) from exc
    return ov.Core()


def compile_onnx(model_bytes: bytes, config: dict):
    """ONNX bytes -> an OpenVINO CompiledModel on the CPU plugin. The model is read from memory
    by the ONNX frontend (`read_model(model=bytes, weights=b"")`): measured against
    `ov.convert_model` on a file (docs/openvino.md), same graph, no temporary file."""
    c = core()
    model = c.read_model(model=model_bytes, weights=b"")
    return c.compile_model(model, "CPU", config)


def feed_positions(model_bytes: bytes, compiled) -> list[int] | None:
    """Per input of the compiled model, the position of the ONNX graph input it came from (the
    cluster's runtime arguments are in ONNX input order); None when they are all there in order."""
    import onnx
    graph_inputs = [i.name for i in onnx.load_from_string(model_bytes).graph.input]
    feed = [next(graph_inputs.index(n) for n in port.get_names() if n in graph_inputs) for port in compiled.inputs]
    return None if feed == list(range(len(graph_inputs))) else feed


def error_summary(exc: BaseException, limit: int = 300) -> str:
    """The informative part of an OpenVINO exception: its text starts with source locations
    ("Exception from src/inference/src/cpp/core.cpp:105:", "Check 'false' failed at ...")."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(("Exception from ", "Check '")) and not ln.endswith(".cpp:")]
    return " ".join(useful or lines)[:limit]


GEMM_LAYERS = ("FullyConnected", "Convolution", "GroupConvolution", "MatMul", "Deconvolution")


def gemm_precisions(compiled) -> dict[str, int]:
    """How many conv / linear / matmul layers of the compiled model run at each precision, as the
    CPU plugin reports it (`runtimePrecision` of the executed graph): "u8"/"i8" are its int8
    kernels, "f32" float arithmetic (ConvInteger / MatMulInteger included)."""
    counts: dict[str, int] = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "layerType" in info and info["layerType"].astype(str) in GEMM_LAYERS:
            precision = info["runtimePrecision"].astype(str) if "runtimePrecision" in info else "?"
            counts[precision] = counts.get(precision, 0) + 1
    return counts


class OvCluster(torch.nn.Module):
    """One cluster: its OpenVINO compiled model, and its FX subgraph as the PyTorch fallback.
    Called with the cluster's runtime inputs only (constants are bound as in the ORT backend).

    One infer request per calling thread: a request runs one inference at a time (measured: two
    threads sharing one got "Infer Request is busy", and the cluster fell back to PyTorch for
    good); the compiled model makes requests for any thread."""

    def __init__(self, fallback: GraphModule, compiled, constants: dict[int, torch.Tensor], arity: int,
                 output_dtypes: list[torch.dtype], single: bool, info: ClusterInfo,
                 feed: list[int] | None = None, finite_checks: dict[int, str | None] | None = None,
                 int64_range=None, argument_check=None):
        super().__init__()
        # runtime argument positions of the compiled model's inputs, in its order; None: all of
        # them in order (OpenVINO drops ONNX inputs nothing reads, e.g. a KV-cache step's sizes)
        self.feed = feed
        # runtime position -> graph input name (None: not one): float32 inputs whose sums the
        # compiled model returns after its own outputs; NaN/inf in one runs the call in PyTorch
        # (clusters.float_inputs says why)
        self.finite_checks = finite_checks or {}
        # int64_bounds.RangeCheck, or None: OpenVINO computes int64 in int32, so a call whose
        # int64 values could leave int32 runs in PyTorch (measured: an int64 5e9 came back from a
        # reshape as 705032704)
        self.int64_range = int64_range
        # argument_checks.ArgumentCheck, or None: an index out of range or an integer divisor of 0
        # among the arguments runs the call in PyTorch, which raises eager's error (OpenVINO
        # would return a row, zeros or -2147483647)
        self.argument_check = argument_check
        self.fallback = fallback   # what the engine was given
        self.in_pytorch = pytorch_graph(fallback)   # block ops an engine lacked called again
        self.constants = constants
        self.arity = arity
        self.output_dtypes = output_dtypes
        self.single_output = single
        self.info = info
        self.scalar_kinds = scalar_kinds(fallback)
        self.check = settings().check_clusters
        self.compiled = compiled   # None: the cluster runs in PyTorch
        # thread id -> its infer request (a thread id reused after a thread ends reuses its request)
        self._requests = {threading.get_ident(): compiled.create_infer_request()} if compiled is not None else {}

    def _request(self):
        key = threading.get_ident()
        request = self._requests.get(key)
        if request is None:
            request = self._requests[key] = self.compiled.create_infer_request()
        return request

    def _all_args(self, runtime_args) -> list:
        it = iter(runtime_args)
        return [self.constants[i] if i in self.constants else next(it) for i in range(self.arity)]

    def _pytorch(self, runtime_args):
        return run_in_pytorch(self.in_pytorch, self._all_args(runtime_args))

    def forward(self, *args):
        if self.compiled is None:
            return self._pytorch(args)
        if self.argument_check is not None and not self.argument_check(self._all_args(args)):
            return self._pytorch(args)
        if self.int64_range is not None and not self.int64_range(self._all_args(args)):
            self.info.int64_overflow_calls = (self.info.int64_overflow_calls or 0) + 1
            return self._pytorch(args)
        try:
            request = self._request()
            fed = args if self.feed is None else [args[i] for i in self.feed]
            request.infer([as_numpy(a) for a in fed], share_inputs=True)
            n = len(self.output_dtypes)
            outs = [request.get_output_tensor(i).data for i in range(n)]
            sums = [request.get_output_tensor(n).data] if self.finite_checks else None
        except Exception as exc:  # any runtime failure: record, warn once, use PyTorch from now on
            self.compiled, self._requests = None, {}
            self.info.status, self.info.reason = "fallback", f"run failed: {error_summary(exc)}"
            log.warning("cluster #%d fell back to PyTorch: %s", self.info.id, self.info.reason)
            return self._pytorch(args)
        if sums and nonfinite_positions(args, self.finite_checks, sums):
            self.info.nonfinite_calls = (self.info.nonfinite_calls or 0) + 1
            return self._pytorch(args)
        # copies: the request's output buffers are reused by the next call
        result = tuple(torch.from_numpy(np.array(o, copy=True)).to(d) for o, d in zip(outs, self.output_dtypes))
        result = result[0] if self.single_output else result
        if self.scalar_kinds is not None:
            result = as_scalars(result, self.scalar_kinds, self.single_output)
        if self.check:
            self._compare(result, self._pytorch(args))
        return result

    def _compare(self, got, want) -> None:
        self.info.max_abs_diff = max(self.info.max_abs_diff or 0.0, worst_abs_diff(got, want))
