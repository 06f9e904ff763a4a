"""Exhaustive proofs that one of ONNX Runtime's fused quantized kernels reproduces qlower's
canonical numerics for one set of qparams, on this machine.

A quantized add reads two uint8 values, so its whole input domain is 65,536 pairs. Instead of
trusting that a fused kernel rounds like the definition (it does not in general: MLAS's AVX2
QLinearAdd computes `a·(sa/sy) + (b·(sb/sy) + const)` with FMAs, where the definition is
`Q(DQ(a) + DQ(b))`), qlower runs the kernel on every pair and compares with the reference
implementation. Where they differ in a single pair, the emitter keeps the plain
DequantizeLinear/Add/QuantizeLinear formulation. Results are cached per qparams.

MLAS takes a second code path for spans of one element (a parallel block of length one); it
rounds `a`'s term before adding it. The engine cannot be made to take that path for a chosen
pair, so it is emulated instead — only after the emulation of the main path has been checked
against the engine on all pairs, so a different kernel (another CPU or ORT build) is never
assumed. Emulated float ops are exact in float64 or the proof is declined.
"""
from __future__ import annotations

import functools
import platform

import numpy as np
import torch

_PAIRS_A, _PAIRS_B = (t.reshape(-1) for t in np.meshgrid(np.arange(256, dtype=np.uint8),
                                                         np.arange(256, dtype=np.uint8), indexing="ij"))


@functools.lru_cache(maxsize=1024)
def qlinear_add_exact(sa: float, za: int, sb: float, zb: int, sy: float, zy: int) -> bool:
    """True when com.microsoft QLinearAdd (uint8) equals the canonical quantized add on every
    input pair and on both of MLAS's code paths here."""
    want = _canonical_add(sa, za, sb, zb, sy, zy)
    try:
        got = _run_qlinear_add(sa, za, sb, zb, sy, zy)
    except Exception:  # no such kernel in this build: not proven
        return False
    if not np.array_equal(got, want):
        return False
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False  # the single-element path is only modelled for MLAS's x86 kernel
    emulated = _mlas_avx2_add(sa, za, sb, zb, sy, zy)
    if emulated is None or not np.array_equal(emulated[0], got):
        return False  # the model of the kernel does not describe this engine
    return np.array_equal(emulated[1], want)


def _canonical_add(sa, za, sb, zb, sy, zy) -> np.ndarray:
    out = torch.ops.qlower.add(torch.from_numpy(_PAIRS_A), sa, za, torch.from_numpy(_PAIRS_B), sb, zb,
                               sy, zy, 0, 255, torch.uint8)
    return out.numpy()


def _run_qlinear_add(sa, za, sb, zb, sy, zy) -> np.ndarray:
    from onnx import TensorProto, helper
    n = _PAIRS_A.size
    scalars = [helper.make_tensor(name, TensorProto.FLOAT, [], [v]) for name, v in (("sa", sa), ("sb", sb), ("sy", sy))]
    scalars += [helper.make_tensor(name, TensorProto.UINT8, [], [v])
                for name, v in (("za", za), ("zb", zb), ("zy", zy))]
    graph = helper.make_graph(
        [helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"], domain="com.microsoft")],
        "qlinear_add_proof", [helper.make_tensor_value_info(x, TensorProto.UINT8, [n]) for x in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [n])], scalars)
    return _run_unoptimized(graph, {"a": _PAIRS_A, "b": _PAIRS_B})


def _mlas_avx2_add(sa, za, sb, zb, sy, zy) -> tuple[np.ndarray, np.ndarray] | None:
    """(main path, single-element path) of MLAS's AVX2 QLinearAdd, emulated with one rounding
    to fp32 per fp32 operation (float64 holds each exact intermediate, or None is returned)."""
    f32 = np.float32
    r_a, r_b = f32(f32(sa) / f32(sy)), f32(f32(sb) / f32(sy))
    offset = _fma32(r_a, f32(za), f32(r_b * f32(zb)))   # compiled with FMA contraction
    fixed = None if offset is None else _fma32(f32(-1.0), offset, f32(zy))
    if fixed is None:
        return None
    a, b = _PAIRS_A.astype(f32), _PAIRS_B.astype(f32)
    inner = _fma32(b, r_b, fixed)
    main = None if inner is None else _fma32(a, r_a, inner)
    shifted = _fma32(f32(1.0), fixed, (a * r_a).astype(f32))   # mul_ps then add_ps: two roundings
    single = None if shifted is None else _fma32(b, r_b, shifted)
    if main is None or single is None:
        return None
    return _saturate_u8(main), _saturate_u8(single)


def _fma32(x, y, z) -> np.ndarray | None:
    """fp32(x*y + z) with a single rounding, for fp32 operands; None where float64 does not
    hold x*y + z exactly (then the proof is declined rather than risk a double rounding)."""
    x, y, z = (np.asarray(v, np.float32).astype(np.float64) for v in (x, y, z))
    product = x * y                      # two 24-bit significands: exact in 53 bits
    total = product + z
    back = total - product               # TwoSum: the rounding error of product + z
    error = (product - (total - back)) + (z - back)
    if np.any(error != 0):
        return None
    return total.astype(np.float32)


def _saturate_u8(v: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(v), 0, 255).astype(np.uint8)  # cvtps (half to even) + saturating packs


POOL_PROOF_MAX_SIZE = 256   # pooled elements; beyond, the exhaustive input grows past ~16 MB


@functools.lru_cache(maxsize=256)
def qlinear_global_average_pool_exact(size: int, scale: float, zp: int) -> bool:
    """True when com.microsoft QLinearGlobalAveragePool (uint8, input and output qparams equal)
    over `size` elements equals the canonical integer mean for every possible sum: the output
    depends only on the sum, so one channel per sum covers the whole domain."""
    if not 1 <= size <= POOL_PROOF_MAX_SIZE:
        return False
    sums = np.arange(255 * size + 1)
    rows = np.repeat((sums // size)[:, None], size, axis=1)
    rows[np.arange(size)[None, :] < (sums % size)[:, None]] += 1   # row i sums to sums[i]
    x = rows.astype(np.uint8).reshape(1, len(sums), size, 1)
    want = torch.ops.qlower.mean(torch.from_numpy(x), zp, [2, 3], True, 0, 255).numpy()
    try:
        got = _run_qlinear_global_average_pool(x, scale, zp)
    except Exception:  # no such kernel, or MLAS refuses the scale range
        return False
    return np.array_equal(got, want)


def _run_qlinear_global_average_pool(x: np.ndarray, scale: float, zp: int) -> np.ndarray:
    from onnx import TensorProto, helper
    consts = [helper.make_tensor("s", TensorProto.FLOAT, [], [scale]),
              helper.make_tensor("z", TensorProto.UINT8, [], [zp])]
    graph = helper.make_graph(
        [helper.make_node("QLinearGlobalAveragePool", ["x", "s", "z", "s", "z"], ["y"], domain="com.microsoft",
                          channels_last=0)],
        "qlinear_gap_proof", [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [x.shape[0], x.shape[1], 1, 1])], consts)
    return _run_unoptimized(graph, {"x": x})


def _run_unoptimized(graph, feed: dict) -> np.ndarray:
    """First output of a one-kernel graph run exactly as written (no ORT rewrites)."""
    import onnxruntime as ort
    from onnx import helper
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17),
                                                                   helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]
