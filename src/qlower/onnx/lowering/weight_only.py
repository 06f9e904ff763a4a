"""ONNX translations of the weight-only ops (ops/weight_only.py).

- linear_weight_only, ONNX Runtime: com.microsoft MatMulNBits (4 bits with fp32 compute,
  accuracy_level 1, float activations; `OrtOptions(weight_only_compute="int8")`: 4 or 8 bits,
  accuracy_level 4, the engine's int8 activations, a declared non-canonical profile). 8 bits with
  fp32 compute: the standard form below, which the session's constant folding turns into one
  fp32 weight for a MatMul (its MatMulNBits dequantized the whole weight on every call). B packed
  [N, blocks, block_size * bits / 8], values in the low bits first; scales [N * blocks]; zero
  points packed likewise per row (omitted when symmetric: the kernel's default 2^(bits-1) is
  the numerics' zero point). A block is a power of two >= 16 dividing the group (a group of
  48: blocks of 16 repeating its scale; per output channel: blocks of 128 repeating the row's
  scale), padded with the zero point's code (a weight of 0) past K. The kernel dequantizes
  exactly as the reference, fp32((u - zp) * s) is one rounding, then sums the products in its
  own order: the declared profile is the reordered fp32 sum, |engine - reference| <=
  numerics.reordered_sum_bound (docs/llm.md).
- linear_weight_only, standard ONNX (OpenVINO): the compressed-weight pattern its CPU plugin
  fuses into its low-bit GEMM: Constant(u4 or u8 codes [N, G, g]) -> Cast(f32) -> Sub(zero
  point [N, G, 1]) -> Mul(scale [N, G, 1]) -> Reshape [N, G*g] -> MatMul with the transposed
  weight (where g does not divide K, the input padded with zeros to G*g: OpenVINO folded a
  sliced weight to f32). Measured: every such weight a u4 / u8 input of the plugin's
  FullyConnected. The dequantized weights are the reference's bit for bit; the GEMM's
  sum order is the engine's (the same profile).
- embedding_weight_only: Gather of the rows of codes [N, G, g] and of their groups' scales and
  zero points [N, G, 1], the same dequantization per row: exact data movement and one rounding
  per value (bit-exact).
"""
from __future__ import annotations

import contextlib
import contextvars

import numpy as np
import onnx_ir as ir
import torch
from torch.fx import Node

from ... import numerics
from ...fx import full_args
from .onnx_ops import MS, const, contrib_op, contrib_ops_allowed, i64, op, value_of
from .table import lowers

q = torch.ops.qlower
_FLOAT = 1

MatMulNBits = contrib_op(MS, "MatMulNBits", ["A", "B", "scales", "zero_points"],
                         {"K": int, "N": int, "bits": int, "block_size": int, "accuracy_level": int},
                         optional=("zero_points",))
# MatMulNBits' compute type (its accuracy_level): "fp32" (1: float activations, the reordered-sum
# profile) or "int8" (4: ONNX Runtime quantizes each block of activations to int8 at run time and
# runs an integer GEMM: its own numerics, not the reference's; measured in docs/llm.md). Set by
# the onnxruntime backend from OrtOptions.weight_only_compute for one translation.
COMPUTE_LEVELS = {"fp32": 1, "int8": 4}
_COMPUTE: contextvars.ContextVar[str] = contextvars.ContextVar("qlower_weight_only_compute", default="fp32")


@contextlib.contextmanager
def weight_only_compute(kind: str):
    """Translate MatMulNBits with compute type `kind` ("fp32" or "int8") within the block."""
    token = _COMPUTE.set(kind)
    try:
        yield
    finally:
        _COMPUTE.reset(token)


def _constants(node: Node) -> str | None:
    """constant codes, scales and zero points"""
    args = full_args(node)
    offset = 1
    if any(getattr(a, "op", None) != "get_attr" for a in args[offset:offset + 3]):
        return "weight-only codes, scales and zero points must be constants"
    return None


def block_size(group_size: int, k: int) -> int | None:
    """The MatMulNBits block for a group: the largest power of two in [16, 128] dividing it (the
    whole row, group_size >= k: 128); None when none does."""
    if group_size >= k:
        return 128
    for b in (128, 64, 32, 16):
        if group_size % b == 0:
            return b
    return None


def _nbits_block(node: Node) -> str | None:
    """constants; group size a multiple of 16 (or the whole row) for MatMulNBits"""
    why = _constants(node)
    if why is not None:
        return why
    args = full_args(node)
    codes = args[1].meta["val"]
    if contrib_ops_allowed() and block_size(int(args[6]), codes.shape[1]) is None:
        return f"MatMulNBits takes blocks of 16, 32, 64 or 128: group size {args[6]} is not a multiple of 16"
    return None


def _per_value(p: np.ndarray, group_size: int, k: int) -> np.ndarray:
    return np.repeat(p, group_size, axis=1)[:, :k]


def pack_nbits(codes: np.ndarray, scale: np.ndarray, zp: np.ndarray, bits: int, group_size: int,
               block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B, scales, zero points) in MatMulNBits' layout for codes [N, K] (module docstring)."""
    n, k = codes.shape
    blocks = -(-k // block)
    s_val = _per_value(scale, group_size, k)          # [N, K], constant over each block
    z_val = _per_value(zp, group_size, k)
    padded = numerics.pad_codes(codes, zp, blocks * block)
    starts = np.arange(blocks) * block
    scales = s_val[:, starts].astype(np.float32)
    zps = z_val[:, starts].astype(np.uint8)
    if bits == 8:
        return padded.reshape(n, blocks, block), scales.reshape(-1), zps
    pairs = padded.reshape(n, blocks, block // 2, 2)
    b = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)
    if blocks % 2:
        zps = np.concatenate([zps, np.zeros((n, 1), np.uint8)], axis=1)
    zp_packed = (zps[:, 0::2] | (zps[:, 1::2] << 4)).astype(np.uint8)
    return b, scales.reshape(-1), zp_packed


@lowers(q.linear_weight_only.default, when=_nbits_block)
def linear_weight_only(x, codes, scale, zero_point, bias, bits: int, group_size: int):
    u, s, z = value_of(codes), value_of(scale), value_of(zero_point)
    n, k = u.shape
    # ONNX Runtime 1.31 has no fp32-compute kernel for 8-bit blocks: MatMulNBits dequantizes the
    # whole weight on every call (measured 10x slower than fp32 MatMul, docs/llm.md), so there
    # the weight is dequantized once, by the session's constant folding, for a MatMul
    if contrib_ops_allowed() and not (bits == 8 and _COMPUTE.get() == "fp32"):
        block = block_size(group_size, k)
        b, scales, zps = pack_nbits(u, s, z, bits, min(group_size, k), block)
        inputs = [x, const(b, np.uint8), const(scales, np.float32)]
        if not bool((z == (1 << (bits - 1))).all()):
            inputs.append(const(zps, np.uint8))
        y = MatMulNBits(*inputs, K=k, N=n, bits=bits, block_size=block, accuracy_level=COMPUTE_LEVELS[_COMPUTE.get()])
    else:
        w, padded_k = _dequantized(u, s, z, bits, group_size)
        if padded_k != k:    # a last, shorter group: the input padded with zeros (exact products of 0)
            rank = len(x.shape)
            x = op.Pad(x, i64([0] * (2 * rank - 1) + [padded_k - k]))
        y = op.MatMul(x, op.Transpose(w, perm=[1, 0]))
    return y if bias is None else op.Add(y, bias)


def _dequantized(u: np.ndarray, s: np.ndarray, z: np.ndarray, bits: int, group_size: int):
    """(Constant(u4/u8 [N, G, g]) -> Cast -> Sub(zp) -> Mul(scale) -> [N, G*g] fp32, G*g): the
    codes past K are the zero point's (weights of 0). A Slice of the weight to K would hide the
    pattern from OpenVINO (it folded such a weight to f32); padding the input keeps it."""
    n, k = u.shape
    g = min(group_size, k)
    groups = s.shape[1]
    padded = numerics.pad_codes(u, z, groups * g)
    dtype = ir.DataType.UINT4 if bits == 4 else ir.DataType.UINT8
    codes = op.Constant(value=ir.tensor(padded.reshape(n, groups, g), dtype=dtype))
    zps = op.Constant(value=ir.tensor(z.reshape(n, groups, 1).astype(np.uint8), dtype=dtype))
    w = op.Mul(op.Sub(op.Cast(codes, to=_FLOAT), op.Cast(zps, to=_FLOAT)),
               const(s.reshape(n, groups, 1), np.float32))
    return op.Reshape(w, i64([n, groups * g])), groups * g


@lowers(q.embedding_weight_only.default, when=_constants)
def embedding_weight_only(ids, codes, scale, zero_point, bits: int, group_size: int):
    u, s, z = value_of(codes), value_of(scale), value_of(zero_point)
    n, k = u.shape
    g = min(group_size, k)
    groups = s.shape[1]
    padded = numerics.pad_codes(u, z, groups * g)   # a last, shorter group: padded with its zero point
    # the rows' codes [..., G, g] and their groups' scales and zero points [..., G, 1]: a table of
    # scales per value would be as large as the float table
    rows = op.Gather(const(padded.reshape(n, groups, g), np.uint8), ids, axis=0)
    zp = op.Gather(const(z.reshape(n, groups, 1).astype(np.uint8), np.uint8), ids, axis=0)
    sc = op.Gather(const(s.reshape(n, groups, 1).astype(np.float32), np.float32), ids, axis=0)
    w = op.Mul(op.Sub(op.Cast(rows, to=_FLOAT), op.Cast(zp, to=_FLOAT)), sc)
    w = op.Reshape(w, op.Concat(op.Shape(ids), i64([groups * g]), axis=0))
    return w if groups * g == k else op.Slice(w, i64([0]), i64([k]), i64([-1]))
