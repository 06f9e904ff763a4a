"""Fused integer ops of the onnxruntime backend (namespace `qlower_ort`): an accumulating
qlower op and the requantize (or dequantize) that consumes it, as ONE node, so the ONNX
translation can map it to ONE fused ONNX Runtime kernel (QLinearConv, com.microsoft QGemm,
QLinearMatMul, com.microsoft MatMulIntegerToFloat).

They exist because a per-node translation table (torch.onnx's) sees one FX node at a time: the
choice "this conv and its requantize are one QLinearConv" must be made on the FX graph
(`fuse_requantize.py`, `fuse_dequantize.py`, `fuse_per_token.py`, which fuse only where the
fused kernel is exact on this CPU).
Each reference kernel is the composition of the two canonical qlower ops, so a cluster that
falls back to PyTorch still computes the canonical numerics bit for bit.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import ops  # noqa: F401  (registers the qlower ops the kernels compose)

_NS = "qlower_ort"
q = torch.ops.qlower


@torch.library.custom_op(f"{_NS}::conv_requant", mutates_args=())
def conv_requant(x: torch.Tensor, x_zp: int, w: torch.Tensor, w_zp: torch.Tensor, bias: Optional[torch.Tensor],
                 stride: list[int], padding: list[int], dilation: list[int], groups: int,
                 acc_scale: torch.Tensor, out_scale: float, out_zp: int, qmin: int, qmax: int,
                 dtype: torch.dtype, axis: Optional[int]) -> torch.Tensor:
    conv = q.conv1d if w.dim() == 3 else q.conv2d
    acc = conv(x, x_zp, w, w_zp, bias, stride, padding, dilation, groups)
    return q.requantize(acc, acc_scale, out_scale, out_zp, qmin, qmax, dtype, axis, "float")


@conv_requant.register_fake
def _(x, x_zp, w, w_zp, bias, stride, padding, dilation, groups, acc_scale, out_scale, out_zp, qmin, qmax, dtype, axis):
    conv = q.conv1d if w.dim() == 3 else q.conv2d
    return conv(x, x_zp, w, w_zp, bias, stride, padding, dilation, groups).to(dtype)


@torch.library.custom_op(f"{_NS}::linear_requant", mutates_args=())
def linear_requant(x: torch.Tensor, x_zp: int, w: torch.Tensor, w_zp: torch.Tensor, bias: Optional[torch.Tensor],
                   acc_scale: torch.Tensor, out_scale: float, out_zp: int, qmin: int, qmax: int,
                   dtype: torch.dtype, axis: Optional[int]) -> torch.Tensor:
    acc = q.linear(x, x_zp, w, w_zp, bias)
    return q.requantize(acc, acc_scale, out_scale, out_zp, qmin, qmax, dtype, axis, "float")


@linear_requant.register_fake
def _(x, x_zp, w, w_zp, bias, acc_scale, out_scale, out_zp, qmin, qmax, dtype, axis):
    return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=dtype)


@torch.library.custom_op(f"{_NS}::matmul_requant", mutates_args=())
def matmul_requant(a: torch.Tensor, a_zp: int, b: torch.Tensor, b_zp: int, acc_scale: torch.Tensor,
                   out_scale: float, out_zp: int, qmin: int, qmax: int, dtype: torch.dtype,
                   axis: Optional[int]) -> torch.Tensor:
    return q.requantize(q.matmul(a, a_zp, b, b_zp), acc_scale, out_scale, out_zp, qmin, qmax, dtype, axis, "float")


@matmul_requant.register_fake
def _(a, a_zp, b, b_zp, acc_scale, out_scale, out_zp, qmin, qmax, dtype, axis):
    return q.matmul(a, a_zp, b, b_zp).to(dtype)


@torch.library.custom_op(f"{_NS}::linear_per_token", mutates_args=())
def linear_per_token(x: torch.Tensor, x_zp: int, w: torch.Tensor, w_zp: torch.Tensor, token_scale: torch.Tensor,
                     w_scale: torch.Tensor) -> torch.Tensor:
    """A per-token linear's GEMM and accumulator dequantization (no bias: it is added after)."""
    return q.dequantize_per_token_acc(q.linear(x, x_zp, w, w_zp, None), token_scale, w_scale)


@linear_per_token.register_fake
def _(x, x_zp, w, w_zp, token_scale, w_scale):
    return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::linear_dequant", mutates_args=())
def linear_dequant(x: torch.Tensor, x_zp: int, w: torch.Tensor, w_zp: torch.Tensor, bias: Optional[torch.Tensor],
                   acc_scale: torch.Tensor, acc_zp: torch.Tensor, axis: Optional[int]) -> torch.Tensor:
    """A linear whose int32 accumulator (bias included) is dequantized to fp32 (a float output)."""
    return q.dequantize(q.linear(x, x_zp, w, w_zp, bias), acc_scale, acc_zp, axis)


@linear_dequant.register_fake
def _(x, x_zp, w, w_zp, bias, acc_scale, acc_zp, axis):
    return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=torch.float32)
