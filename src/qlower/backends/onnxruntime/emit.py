"""Emit one cluster (an FX GraphModule of qlower integer ops and float ATen ops) as ONNX.

Formulations, all bit-exact against qlower's `float` numerics profile (tests decide):
- conv2d -> requantize:  QLinearConv with X_scale = 1 and W_scale = s_acc, so ONNX Runtime's
  fp32(X_scale * W_scale) / Y_scale is exactly fp32(s_acc / sy) = the canonical M; chosen
  when s8 weights are exact on this CPU (VNNI or 7-bit weights). Otherwise ConvInteger with
  u8 weights (w + 128, zero point 128), which is exact on AVX2, + int32 bias + requantize.
- linear -> requantize:  com.microsoft QGemm (same scale trick, 2-D view) with a bias;
                         QLinearMatMul (same trick, N-D input, per-column scales) without.
- matmul -> requantize:  QLinearMatMul for u8 x u8 activations (a_scale = 1, b_scale = s_acc).
- linear / matmul:       MatMulInteger (s8 weights when exact, else u8 = w + 128) + bias.
- requantize:            Cast(float) -> Mul(M) -> QuantizeLinear(scale 1, zp) [-> Clip]:
                         RNE(fp32(acc) * M) + zp, saturated: the canonical formula.
- add:                    com.microsoft QLinearAdd where kernel_proofs shows it equal to the
                         canonical add on every input pair; else as mul.
- integer mean over H, W: com.microsoft QLinearGlobalAveragePool where kernel_proofs shows it
                         equal on every possible sum; else int32 ReduceSum -> Div -> Quantize.
- add / mul:             DequantizeLinear x2 -> Add/Mul -> QuantizeLinear [-> Clip].
- quantize/dequantize:   QuantizeLinear (true fp32 division, RNE) / DequantizeLinear.
Float ops map to their standard ONNX counterparts (opset 23); block ops to one node each
(blockops.py).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch.fx import GraphModule, Node

from ... import numerics
from ...fx import constant_value, schema_name
from .cpu import s8_weights_exact
from .flatten_rows import flatten_rows
from .kernel_proofs import qlinear_add_exact, qlinear_global_average_pool_exact

OPSET = 23   # RMSNormalization, Attention (block ops) are standard from 23 on
aten = torch.ops.aten
q = torch.ops.qlower

COMPARE = {"ge": "GreaterOrEqual", "gt": "Greater", "le": "LessOrEqual", "lt": "Less", "eq": "Equal"}
UNARY = {"neg": "Neg", "sqrt": "Sqrt", "exp": "Exp", "cos": "Cos", "sin": "Sin", "logical_not": "Not",
         "bitwise_not": "Not", "reciprocal": "Reciprocal", "erf": "Erf"}
BODY_CONSTANT_LIMIT = 64
_DTYPE = {torch.float32: TensorProto.FLOAT, torch.uint8: TensorProto.UINT8, torch.int8: TensorProto.INT8,
          torch.float64: TensorProto.DOUBLE,
          torch.int32: TensorProto.INT32, torch.int64: TensorProto.INT64, torch.bool: TensorProto.BOOL}


class EmitError(Exception):
    """The cluster cannot be expressed in ONNX (the partition falls back to PyTorch)."""


@dataclass
class Emitter:
    gm: GraphModule
    constants: dict[str, torch.Tensor]      # placeholder name -> value, for constant inputs
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)
    deferred_conv: dict = field(default_factory=dict)
    functions: dict = field(default_factory=dict)   # (name, overload) -> FunctionProto (block ops)
    parent: "Emitter | None" = None                  # set while emitting a function body
    hoisted: list = field(default_factory=list)      # body constants passed in from the parent
    _n: int = 0

    # ---------------------------------------------------------------- helpers
    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{hint}__{self._n}"

    def const(self, value, hint: str, dtype=None) -> str:
        arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value, dtype=dtype)
        if dtype is not None:
            arr = arr.astype(dtype)
        tensor = numpy_helper.from_array(np.array(arr, order="C"), self.fresh(hint))  # keeps 0-d scalars 0-d
        if self.parent is None:
            self.inits.append(tensor)
        elif arr.size <= BODY_CONSTANT_LIMIT:  # small: part of the function body
            self.nodes.append(helper.make_node("Constant", [], [tensor.name], value=tensor))
        else:  # weights: an initializer of the model, passed to the function as an input
            self.parent.inits.append(tensor)
            self.hoisted.append(tensor.name)
        return tensor.name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, domain: str = "", **attrs) -> str:
        out = out or self.fresh(op_type)
        self.nodes.append(helper.make_node(op_type, inputs, [out], domain=domain or None, **attrs))
        return out

    def cast_to(self, node: Node, dtype: torch.dtype) -> str:
        """node's value, cast when its dtype differs (type promotion, as PyTorch does)."""
        if node.meta["val"].dtype == dtype:
            return node.name
        return self.op("Cast", [node.name], to=_DTYPE[dtype])

    def value(self, node: Node) -> torch.Tensor | None:
        """Constant value of an FX input (get_attr or constant placeholder)."""
        if node.op == "placeholder" and node.name in self.constants:
            return self.constants[node.name]
        return constant_value(self.gm, node)

    # ---------------------------------------------------------------- integer ops
    def op_clamped(self, op_type: str, inputs: list[str], out: str, lo: int, hi: int, dtype: torch.dtype,
                   domain: str = "", **attrs) -> str:
        """Emit op_type into `out`, through a Clip to [lo, hi] when that is narrower than the
        dtype's range (a fused relu/clamp: exact, since quantize is monotone)."""
        narrowed = (lo, hi) != numerics.dtype_range(dtype)
        y = self.op(op_type, inputs, None if narrowed else out, domain=domain, **attrs)
        if narrowed:
            np_dtype = np.uint8 if dtype == torch.uint8 else np.int8
            self.op("Clip", [y, self.const(lo, "lo", np_dtype), self.const(hi, "hi", np_dtype)], out)
        return out

    def requant_chain(self, acc: str, multiplier: torch.Tensor, shape_axis: int | None, rank: int,
                      zp: int, lo: int, hi: int, dtype: torch.dtype, out: str) -> str:
        m = multiplier.to(torch.float32)
        if m.numel() > 1:
            shape = [1] * rank
            shape[shape_axis] = m.numel()
            m = m.reshape(shape)
        else:
            m = m.reshape(())
        v = self.op("Mul", [self.op("Cast", [acc], to=TensorProto.FLOAT), self.const(m, "M")])
        np_dtype = np.uint8 if dtype == torch.uint8 else np.int8
        return self.op_clamped("QuantizeLinear", [v, self.const(np.float32(1.0), "one"),
                                                  self.const(zp, "zp", np_dtype)], out, lo, hi, dtype)

    def weight_operand(self, w: torch.Tensor, w_zp: torch.Tensor, transpose: bool) -> tuple[str, str, bool]:
        """(weight name, zero-point name, is_s8) in the formulation that is exact on this CPU."""
        if w_zp.unique().numel() != 1:
            raise EmitError("per-channel weight zero points are not emitted")
        zp = int(w_zp.reshape(-1)[0])
        wt = w.t() if transpose else w
        if s8_weights_exact(int(w.min()), int(w.max())) and w.dtype == torch.int8:
            return self.const(wt.contiguous(), "w_s8"), self.const(zp, "w_zp", np.int8), True
        shifted = (wt.to(torch.int32) + 128).to(torch.uint8)  # exact u8 x u8 path on AVX2
        return self.const(shifted.contiguous(), "w_u8"), self.const(zp + 128, "w_zp", np.uint8), False

    def emit_accumulate(self, node: Node, name: str) -> str:
        t = node.target
        if t is q.matmul.default:
            a, a_zp, b, b_zp = node.args
            b_dtype = b.meta["val"].dtype
            a_zp_n = self.const(a_zp, "a_zp", np.uint8 if a.meta["val"].dtype == torch.uint8 else np.int8)
            b_zp_n = self.const(b_zp, "b_zp", np.uint8 if b_dtype == torch.uint8 else np.int8)
            return self.op("MatMulInteger", [a.name, b.name, a_zp_n, b_zp_n], name)
        x, x_zp, w, w_zp, bias = node.args[:5]
        wv, zpv = self.value(w), self.value(w_zp)
        if wv is None or zpv is None:
            raise EmitError("weights must be constants")
        x_zp_n = self.const(x_zp, "x_zp", np.uint8 if x.meta["val"].dtype == torch.uint8 else np.int8)
        bv = self.value(bias) if bias is not None else None
        if t is q.linear.default:
            wn, zn, _ = self.weight_operand(wv, zpv, transpose=True)
            acc = self.op("MatMulInteger", [x.name, wn, x_zp_n, zn])
            return self.op("Add", [acc, self.const(bv, "bias")], name) if bv is not None else \
                self.op("Identity", [acc], name)
        if t in (q.conv2d.default, q.conv1d.default):
            stride, padding, dilation, groups = node.args[5:9]
            wn, zn, _ = self.weight_operand(wv, zpv, transpose=False)
            acc = self.op("ConvInteger", [x.name, wn, x_zp_n, zn], strides=list(stride),
                          pads=list(padding) * 2, dilations=list(dilation), group=int(groups))
            if bv is not None:
                spatial = [1] * (wv.dim() - 2)
                return self.op("Add", [acc, self.const(bv.reshape(1, -1, *spatial), "bias")], name)
            return self.op("Identity", [acc], name)
        raise EmitError(f"no ONNX lowering for {schema_name(node)}")

    def try_qlinearconv(self, conv: Node, rq: Node) -> bool:
        x, x_zp, w, w_zp, bias, stride, padding, dilation, groups = conv.args
        wv, zpv = self.value(w), self.value(w_zp)
        acc_scale = self.value(rq.args[1])
        _, _, out_scale, out_zp, lo, hi, dtype = rq.args[:7]
        if wv is None or acc_scale is None or x.meta["val"].dtype != torch.uint8 or dtype != torch.uint8:
            return False
        if not s8_weights_exact(int(wv.min()), int(wv.max())) or zpv.unique().numel() != 1 or int(zpv[0]) != 0:
            return False
        bv = self.value(bias) if bias is not None else None
        inputs = [x.name, self.const(np.float32(1.0), "one"), self.const(x_zp, "x_zp", np.uint8),
                  self.const(wv, "w_s8"), self.const(acc_scale.reshape(-1).to(torch.float32), "w_scale"),
                  self.const(np.zeros(acc_scale.numel(), np.int8) if acc_scale.numel() > 1 else np.int8(0), "w_zp"),
                  self.const(np.float32(out_scale), "y_scale"), self.const(out_zp, "y_zp", np.uint8)]
        if bv is not None:
            inputs.append(self.const(bv.to(torch.int32), "bias"))
        self.op_clamped("QLinearConv", inputs, rq.name, lo, hi, torch.uint8, strides=list(stride),
                        pads=list(padding) * 2, dilations=list(dilation), group=int(groups))
        return True

    def try_qgemm(self, linear: Node, rq: Node) -> bool:
        """linear -> requantize as com.microsoft QGemm with A_scale = 1, B_scale = s_acc (so the
        multiplier is fp32(s_acc / sy), the canonical one), on a 2-D view of the input; without
        a bias, as QLinearMatMul (same scale trick, per-column B scales, N-D input)."""
        x, x_zp, w, w_zp, bias = linear.args
        wv, zpv, acc_scale = self.value(w), self.value(w_zp), self.value(rq.args[1])
        _, _, out_scale, out_zp, lo, hi, dtype = rq.args[:7]
        if wv is None or acc_scale is None or x.meta["val"].dtype != torch.uint8 or dtype != torch.uint8:
            return False
        if not s8_weights_exact(int(wv.min()), int(wv.max())) or zpv.unique().numel() != 1 or int(zpv[0]) != 0:
            return False
        k, n = wv.shape[1], wv.shape[0]
        rank = x.meta["val"].dim()
        scales = acc_scale.reshape(-1).to(torch.float32)
        per_channel = scales.numel() > 1
        x_scale_zp = [self.const(np.float32(1.0), "one"), self.const(x_zp, "x_zp", np.uint8)]
        w_operands = [self.const(wv.t().contiguous(), "w_s8"),
                      self.const(scales if per_channel else scales.reshape(()), "w_scale"),
                      self.const(np.zeros(n, np.int8) if per_channel else np.int8(0), "w_zp")]
        y_scale_zp = [self.const(np.float32(out_scale), "y_scale"), self.const(out_zp, "y_zp", np.uint8)]
        if bias is None:  # no bias to add in int32: QLinearMatMul takes N-D input, no reshapes
            self.op_clamped("QLinearMatMul", [x.name, *x_scale_zp, *w_operands, *y_scale_zp], rq.name, lo, hi,
                            torch.uint8)
            return True
        a = x.name if rank == 2 else self.op("Reshape", [x.name, self.const(np.array([-1, k], np.int64), "shape")])
        inputs = [a, *x_scale_zp, *w_operands, self.const(self.value(bias).to(torch.int32), "bias"), *y_scale_zp]
        if rank == 2:
            self.op_clamped("QGemm", inputs, rq.name, lo, hi, torch.uint8, domain="com.microsoft")
            return True
        y = self.op("QGemm", inputs, domain="com.microsoft")
        out_shape = list(rq.meta["val"].shape)
        shape = self.const(np.array(out_shape, np.int64), "shape") if all(isinstance(d, int) for d in out_shape) \
            else self.op("Concat", [self.op("Shape", [x.name], end=-1), self.const(np.array([n], np.int64), "n")], axis=0)
        self.op_clamped("Reshape", [y, shape], rq.name, lo, hi, torch.uint8)
        return True

    def try_qlinearmatmul(self, mm: Node, rq: Node) -> bool:
        """u8 x u8 matmul -> requantize as QLinearMatMul with a_scale = 1, b_scale = s_acc: its
        multiplier fp32(a_scale * b_scale) / y_scale is the canonical fp32(s_acc / sy)."""
        a, a_zp, b, b_zp = mm.args
        acc_scale = self.value(rq.args[1])
        _, _, out_scale, out_zp, lo, hi, dtype = rq.args[:7]
        if acc_scale is None or acc_scale.numel() != 1 or a.meta["val"].dtype != torch.uint8 \
                or b.meta["val"].dtype != torch.uint8:
            return False
        np_out = np.uint8 if dtype == torch.uint8 else np.int8
        inputs = [a.name, self.const(np.float32(1.0), "one"), self.const(a_zp, "a_zp", np.uint8),
                  b.name, self.const(np.float32(acc_scale.reshape(())), "b_scale"), self.const(b_zp, "b_zp", np.uint8),
                  self.const(np.float32(out_scale), "y_scale"), self.const(out_zp, "y_zp", np_out)]
        self.op_clamped("QLinearMatMul", inputs, rq.name, lo, hi, dtype)
        return True

    def try_qlinearadd(self, node: Node) -> bool:
        """u8 + u8 -> u8 without broadcasting as one com.microsoft QLinearAdd, where it is
        proven equal to the canonical add on all 65,536 input pairs (kernel_proofs)."""
        a, sa, za, b, sb, zb, sy, zy, lo, hi, dtype = node.args
        if not (a.meta["val"].dtype == b.meta["val"].dtype == dtype == torch.uint8) \
                or tuple(a.meta["val"].shape) != tuple(b.meta["val"].shape):
            return False
        if not qlinear_add_exact(float(sa), int(za), float(sb), int(zb), float(sy), int(zy)):
            return False
        u8 = lambda v, hint: self.const(v, hint, np.uint8)  # noqa: E731
        inputs = [a.name, self.const(np.float32(sa), "s"), u8(za, "z"), b.name, self.const(np.float32(sb), "s"),
                  u8(zb, "z"), self.const(np.float32(sy), "s"), u8(zy, "z")]
        self.op_clamped("QLinearAdd", inputs, node.name, lo, hi, dtype, domain="com.microsoft")
        return True

    def try_qlinear_global_average_pool(self, node: Node) -> bool:
        """Integer mean of a u8 NCHW tensor over H, W as one com.microsoft
        QLinearGlobalAveragePool (scale 1 in and out), where kernel_proofs shows it equal to
        the canonical integer mean for every possible sum."""
        x, zp, dims, keep, qmin, qmax = node.args
        val = x.meta["val"]
        if val.dtype != torch.uint8 or val.dim() != 4 or {d % 4 for d in dims} != {2, 3} \
                or (qmin, qmax) != (0, 255) or not all(isinstance(d, int) for d in val.shape[2:]):
            return False
        if not qlinear_global_average_pool_exact(int(val.shape[2] * val.shape[3]), 1.0, int(zp)):
            return False
        one, z = self.const(np.float32(1.0), "one"), self.const(zp, "zp", np.uint8)
        pooled = self.op("QLinearGlobalAveragePool", [x.name, one, z, one, z], node.name if keep else None,
                         domain="com.microsoft", channels_last=0)
        if not keep:
            self.op("Squeeze", [pooled, self.const(np.array([2, 3], np.int64), "axes")], node.name)
        return True

    # ---------------------------------------------------------------- dispatch
    def emit(self, node: Node) -> None:
        t, name = node.target, node.name
        if t in (q.conv2d.default, q.conv1d.default, q.linear.default, q.matmul.default) and len(node.users) == 1 and \
                next(iter(node.users)).target is q.requantize.default:
            self.deferred_conv[name] = node
            return
        if t is q.requantize.default:
            acc, scale, out_scale, out_zp, lo, hi, dtype, axis, profile = node.args
            if profile != "float":
                raise EmitError("onnxruntime reproduces only the 'float' requantization profile")
            if acc.name in self.deferred_conv:
                producer = self.deferred_conv.pop(acc.name)
                fused = {q.linear.default: self.try_qgemm, q.matmul.default: self.try_qlinearmatmul}.get(
                    producer.target, self.try_qlinearconv)
                if fused(producer, node):
                    return
                self.emit_accumulate(producer, producer.name)
            m = numerics.float_multiplier(self.value(scale), out_scale)
            rank = acc.meta["val"].dim()
            self.requant_chain(acc.name, m, None if axis is None else axis % rank, rank, out_zp, lo, hi, dtype, name)
        elif t in (q.conv2d.default, q.conv1d.default, q.linear.default, q.matmul.default):
            self.emit_accumulate(node, name)
        elif t is q.quantize.default:
            x, scale, zp, qmin, qmax, dtype, axis = node.args
            np_dtype = np.uint8 if dtype == torch.uint8 else np.int8
            if (qmin, qmax) != numerics.dtype_range(dtype):
                raise EmitError("quantize with a narrowed range is not emitted")
            sc, z = self.value(scale), self.value(zp)
            attrs = {"axis": int(axis)} if axis is not None else {}
            self.op("QuantizeLinear", [x.name, self.const(_squeeze(sc).to(torch.float32), "scale"),
                                       self.const(_squeeze(z).numpy().astype(np_dtype), "zp")], name, **attrs)
        elif t is q.dequantize.default:
            x, scale, zp, axis = node.args
            in_dtype = x.meta["val"].dtype
            np_dtype = {torch.uint8: np.uint8, torch.int8: np.int8, torch.int32: np.int32}[in_dtype]
            attrs = {"axis": int(axis) % x.meta["val"].dim()} if axis is not None else {}
            self.op("DequantizeLinear", [x.name, self.const(_squeeze(self.value(scale)).to(torch.float32), "scale"),
                                         self.const(_squeeze(self.value(zp)).numpy().astype(np_dtype), "zp")],
                    name, **attrs)
        elif t is q.add.default and self.try_qlinearadd(node):
            return
        elif t in (q.add.default, q.mul.default):
            a, sa, za, b, sb, zb, sy, zy, lo, hi, dtype = node.args
            np_in = lambda n: np.uint8 if n.meta["val"].dtype == torch.uint8 else np.int8
            da = self.op("DequantizeLinear", [a.name, self.const(np.float32(sa), "s"), self.const(za, "z", np_in(a))])
            db = self.op("DequantizeLinear", [b.name, self.const(np.float32(sb), "s"), self.const(zb, "z", np_in(b))])
            s = self.op("Add" if t is q.add.default else "Mul", [da, db])
            np_out = np.uint8 if dtype == torch.uint8 else np.int8
            self.op_clamped("QuantizeLinear", [s, self.const(np.float32(sy), "s"), self.const(zy, "z", np_out)],
                            name, lo, hi, dtype)
        elif t is q.mean.default and self.try_qlinear_global_average_pool(node):
            return
        elif t is q.mean.default:
            x, zp, dims, keep, qmin, qmax = node.args
            rank = x.meta["val"].dim()
            n = int(np.prod([x.meta["val"].shape[d % rank] for d in dims]))
            np_dtype = np.uint8 if x.meta["val"].dtype == torch.uint8 else np.int8
            centered = self.op("Sub", [self.op("Cast", [x.name], to=TensorProto.INT32), self.const(np.int32(zp), "zp")])
            total = self.op("ReduceSum", [centered, self.const(np.array([d % rank for d in dims], np.int64), "axes")],
                            keepdims=int(bool(keep)))
            # fp32(S / N) is exact or at least 1/(2N) away from a tie while |S| < 2^23, so RNE of it
            # (QuantizeLinear with scale 1) is the exact half-to-even quotient.
            v = self.op("Div", [self.op("Cast", [total], to=TensorProto.FLOAT), self.const(np.float32(n), "n")])
            self.op("QuantizeLinear", [v, self.const(np.float32(1.0), "one"), self.const(zp, "zp", np_dtype)], name)
        elif t is q.max_pool2d.default:
            x, k, stride, padding, dilation, ceil = node.args
            self.op("MaxPool", [x.name], name, kernel_shape=list(k), strides=list(stride or k),
                    pads=list(padding) * 2, dilations=list(dilation), ceil_mode=int(ceil))
        else:
            self.emit_aten(node)

    def emit_aten(self, node: Node) -> None:
        t, name, a = node.target, node.name, node.args
        if getattr(t, "namespace", None) == "qlower" or t in BLOCK_LIKE_ATEN:
            if emit_block_op(self, node):
                return
            raise EmitError(f"no ONNX lowering for {schema_name(node)} with these arguments")
        if t in FLOAT_NN:
            FLOAT_NN[t](self, node)
        elif t is aten.adaptive_avg_pool2d.default:
            if list(a[1]) not in ([1, 1], [1]):
                raise EmitError("adaptive_avg_pool2d only to 1x1")
            self.op("GlobalAveragePool", [a[0].name], name)
        elif t is aten.flatten.using_ints:
            self.op("Reshape", [a[0].name, self.const(np.array(_reshape_target(node), np.int64), "shape")], name)
        elif t in (aten.reshape.default, aten.view.default):
            self.op("Reshape", [a[0].name, self.const(np.array(a[1], np.int64), "shape")], name)
        elif t in (aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims):
            dims = a[1] if isinstance(a[1], (list, tuple)) else [a[1]]
            self.op("Unsqueeze" if t is aten.unsqueeze.default else "Squeeze",
                    [a[0].name, self.const(np.array(list(dims), np.int64), "axes")], name)
        elif t is aten.select.int:
            self.op("Gather", [a[0].name, self.const(np.array(a[2], np.int64), "index")], name, axis=int(a[1]))
        elif t is aten.embedding.default:
            self.op("Gather", [a[0].name, a[1].name], name, axis=0)
        elif t is aten.mean.dim:
            keep = a[2] if len(a) > 2 else node.kwargs.get("keepdim", False)
            self.op("ReduceMean", [a[0].name, self.const(np.array(list(a[1]), np.int64), "axes")], name,
                    keepdims=int(bool(keep)))
        elif t is aten.stack.default:
            dim = a[1] if len(a) > 1 else 0
            parts = [self.op("Unsqueeze", [x.name, self.const(np.array([dim], np.int64), "axes")]) for x in a[0]]
            self.op("Concat", parts, name, axis=int(dim))
        elif t is aten.arange.default:
            self.op("Identity", [self.const(np.arange(int(a[0]), dtype=np.int64), "arange")], name)
        elif t is aten.rsub.Scalar:
            self.op("Sub", [self.const(np.float32(a[1]), "c"), self.cast_to(a[0], torch.float32)], name)
        elif getattr(t, "_schema", None) is not None and t._schema.name.split("::")[-1] in COMPARE:
            op = COMPARE[t._schema.name.split("::")[-1]]
            other = a[1] if isinstance(a[1], Node) else None
            dtype = a[0].meta["val"].dtype
            rhs = self.cast_to(other, dtype) if other is not None else \
                self.const(np.array(a[1], dtype=torch.empty(0, dtype=dtype).numpy().dtype), "c")
            self.op(op, [a[0].name, rhs], name)
        elif t in (aten.__and__.Tensor, aten.logical_and.default, aten.bitwise_and.Tensor):
            self.op("And", [a[0].name, a[1].name], name)
        elif t in (aten.__or__.Tensor, aten.logical_or.default, aten.bitwise_or.Tensor):
            self.op("Or", [a[0].name, a[1].name], name)
        elif getattr(t, "_schema", None) is not None and t._schema.name.split("::")[-1] in UNARY:
            self.op(UNARY[t._schema.name.split("::")[-1]], [a[0].name], name)
        elif t is aten.rsqrt.default:
            self.op("Reciprocal", [self.op("Sqrt", [a[0].name])], name)
        elif t is aten.silu.default:
            self.op("Mul", [a[0].name, self.op("Sigmoid", [a[0].name])], name)
        elif t is aten.pow.Tensor_Scalar:
            self.op("Pow", [a[0].name, self.const(np.float32(a[1]), "exp")], name)
        elif t in (aten.zeros_like.default, aten.ones_like.default, aten.full_like.default):
            fill = {aten.zeros_like.default: 0, aten.ones_like.default: 1}.get(t, a[1] if len(a) > 1 else 0)
            value = numpy_helper.from_array(np.array([fill], dtype=torch.empty(0, dtype=node.meta["val"].dtype).numpy().dtype))
            self.op("ConstantOfShape", [self.op("Shape", [a[0].name])], name, value=value)
        elif t is aten.index.Tensor:  # x[i0, i1, ...] on the leading dims: GatherND
            x, indices = a
            shape = list(torch.broadcast_shapes(*[i.meta["val"].shape for i in indices]))
            if any(not isinstance(d, int) for d in shape):
                raise EmitError("advanced indexing with symbolic index shapes is not emitted")
            target, last = self.const(np.array(shape, np.int64), "shape"), self.const(np.array([-1], np.int64), "ax")
            parts = [self.op("Unsqueeze", [self.op("Expand", [self.cast_to(i, torch.int64), target]), last])
                     for i in indices]
            stacked = self.op("Concat", parts, axis=-1) if len(parts) > 1 else parts[0]
            self.op("GatherND", [x.name, stacked], name)
        elif t is aten.index_copy.default:  # x with x[..., index, ...] = src along dim
            x, dim, index, src = a
            rank = src.meta["val"].dim()
            dim = dim % rank
            shape = [1] * rank
            shape[dim] = -1
            idx = self.op("Reshape", [self.cast_to(index, torch.int64), self.const(np.array(shape, np.int64), "shape")])
            idx = self.op("Expand", [idx, self.op("Shape", [src.name])])
            self.op("ScatterElements", [x.name, idx, src.name], name, axis=dim)
        elif t is aten.copy.default:  # src broadcast into self's shape and dtype
            dtype = node.meta["val"].dtype
            self.op("Expand", [self.cast_to(a[1], dtype), self.op("Shape", [a[0].name])], name)
        elif t is aten.gather.default:
            self.op("GatherElements", [a[0].name, self.cast_to(a[2], torch.int64)], name, axis=int(a[1]))
        elif t is aten.index_select.default:
            self.op("Gather", [a[0].name, self.cast_to(a[2], torch.int64)], name, axis=int(a[1]))
        elif t in (aten.where.Scalar, aten.where.ScalarOther, aten.where.ScalarSelf):
            dtype = node.meta["val"].dtype
            self.op("Where", [a[0].name] + [self.cast_to(x, dtype) if isinstance(x, Node)
                                            else self.const(torch.tensor(x, dtype=dtype), "c") for x in a[1:3]], name)
        elif t is aten.where.self:
            self.op("Where", [a[0].name] + [self.cast_to(x, node.meta["val"].dtype) if isinstance(x, Node)
                                            else self.const(np.array(x, np.float32), "c") for x in a[1:3]], name)
        elif t is aten.masked_fill.Scalar:
            dtype = node.meta["val"].dtype
            fill = self.const(torch.tensor(a[2], dtype=dtype), "fill")
            self.op("Where", [a[1].name, fill, a[0].name], name)
        elif t is aten.to.dtype_layout:
            self.op("Cast", [a[0].name], name, to=_DTYPE[node.meta["val"].dtype])
        elif t is aten.split.Tensor:
            size, dim = a[1], (a[2] if len(a) > 2 else 0)
            total = a[0].meta["val"].shape[dim]
            sizes = [size] * (total // size) + ([total % size] if total % size else [])
            outs = [f"{name}__{i}" for i in range(len(sizes))]
            self.nodes.append(helper.make_node("Split", [a[0].name, self.const(np.array(sizes, np.int64), "sizes")],
                                               outs, axis=int(dim)))
        elif t is aten.to.dtype:
            self.op("Cast", [a[0].name], name, to=_DTYPE[node.meta["val"].dtype])
        elif t is aten.permute.default:
            self.op("Transpose", [a[0].name], name, perm=[int(p) % len(a[1]) for p in a[1]])
        elif t is aten.transpose.int:
            rank = a[0].meta["val"].dim()
            perm = list(range(rank))
            i, j = a[1] % rank, a[2] % rank
            perm[i], perm[j] = perm[j], perm[i]
            self.op("Transpose", [a[0].name], name, perm=perm)
        elif t is aten.unbind.int:
            dim = a[1] if len(a) > 1 else 0
            n = a[0].meta["val"].shape[dim]
            outs = [f"{name}__{i}" for i in range(n)]
            parts = [self.fresh("split") for _ in range(n)]
            self.nodes.append(helper.make_node("Split", [a[0].name], parts, axis=dim, num_outputs=n))
            for p, o in zip(parts, outs):
                self.op("Squeeze", [p, self.const(np.array([dim], np.int64), "axes")], o)
        elif t is operator.getitem:
            self.op("Identity", [f"{a[0].name}__{a[1]}"], name)  # outputs of unbind / split
        elif t is aten.addmm.default:
            beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
            self.op("Gemm", [a[1].name, a[2].name, a[0].name], name, alpha=float(alpha), beta=float(beta))
        elif t in (aten.matmul.default, aten.bmm.default, aten.mm.default):
            self.op("MatMul", [a[0].name, a[1].name], name)
        elif t in (aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor, aten.div.Tensor):
            op = {aten.add.Tensor: "Add", aten.mul.Tensor: "Mul", aten.sub.Tensor: "Sub", aten.div.Tensor: "Div"}[t]
            out_dtype = node.meta["val"].dtype
            np_dtype = {torch.float32: np.float32, torch.int64: np.int64, torch.int32: np.int32}.get(out_dtype)
            if np_dtype is None:
                raise EmitError(f"{op} on {out_dtype} is not emitted")
            ins = [self.cast_to(x, out_dtype) if isinstance(x, Node) else self.const(np.array(x, np_dtype), "c")
                   for x in a[:2]]
            self.op(op, ins, name)
        elif t in (aten.dropout.default, aten.to.device, aten.clone.default, aten.contiguous.default,
                   aten.lift_fresh_copy.default):
            if t is aten.dropout.default and len(a) > 2 and a[2]:
                raise EmitError("dropout in training mode")
            out_dtype = node.meta["val"].dtype
            if a[0].meta["val"].dtype != out_dtype:  # x.to(device, dtype) also converts
                self.op("Cast", [a[0].name], name, to=_DTYPE[out_dtype])
            else:
                self.op("Identity", [a[0].name], name)
        elif t in (aten.new_ones.default, aten.new_zeros.default, aten.ones.default, aten.zeros.default,
                   aten.full.default):
            val = node.meta["val"]
            if any(not isinstance(d, int) for d in val.shape):
                raise EmitError("constant of symbolic shape")
            fill = 1 if t in (aten.new_ones.default, aten.ones.default) else 0 if t is not aten.full.default else a[1]
            self.op("Identity", [self.const(torch.full(tuple(val.shape), fill, dtype=val.dtype), "filled")], name)
        elif t is aten.softmax.int:
            self.op("Softmax", [a[0].name], name, axis=int(a[1]))
        elif t is aten.layer_norm.default:
            x, shape, w, b = a[:4]
            eps = a[4] if len(a) > 4 else 1e-5
            d = int(np.prod(shape))
            wn = w.name if w is not None and self.value(w) is None else \
                self.const(self.value(w) if w is not None else torch.ones(d), "ln_w")
            bn = b.name if b is not None and self.value(b) is None else \
                self.const(self.value(b) if b is not None else torch.zeros(d), "ln_b")
            self.op("LayerNormalization", [x.name, wn, bn], name, axis=-len(shape), epsilon=float(eps))
        elif t is aten.gelu.default:
            approx = node.kwargs.get("approximate", "none")
            self.op("Gelu", [a[0].name], name, approximate=approx)
        elif t in (aten.relu.default, aten.abs.default, aten.sigmoid.default, aten.tanh.default):
            op = {aten.relu.default: "Relu", aten.abs.default: "Abs", aten.sigmoid.default: "Sigmoid",
                  aten.tanh.default: "Tanh"}[t]
            self.op(op, [a[0].name], name)
        elif t is aten.linear.default:
            x, w = a[0], a[1]
            b = a[2] if len(a) > 2 else None
            wt = self.op("Transpose", [w.name], perm=[1, 0])
            y = self.op("MatMul", [x.name, wt], None if b is not None else name)
            if b is not None:
                self.op("Add", [y, b.name], name)
        elif t is aten.cat.default:
            dim = a[1] if len(a) > 1 else 0
            self.op("Concat", [x.name for x in a[0]], name, axis=int(dim))
        elif t is aten.slice.Tensor:
            x, dim, start, end = (list(a) + [0, None, None])[:4]
            step = a[4] if len(a) > 4 else 1
            big = np.iinfo(np.int64).max
            self.op("Slice", [x.name, self.const(np.array([start or 0], np.int64), "st"),
                              self.const(np.array([big if end is None else end], np.int64), "en"),
                              self.const(np.array([dim], np.int64), "ax"),
                              self.const(np.array([step], np.int64), "sp")], name)
        elif t is aten.expand.default:
            out = node.meta["val"].shape
            if any(not isinstance(d, int) for d in out):
                raise EmitError("expand to a symbolic shape is not emitted")
            self.op("Expand", [a[0].name, self.const(np.array(list(out), np.int64), "shape")], name)
        elif t is aten.alias.default:
            self.op("Identity", [a[0].name], name)
        else:
            raise EmitError(f"no ONNX lowering for {schema_name(node)}")


def _reshape_target(node: Node) -> list[int]:
    """Static output shape for Reshape; a dynamic leading dim becomes 0 (copy the input's)."""
    out = list(node.meta["val"].shape)
    dims = [d if isinstance(d, int) else (0 if i == 0 else None) for i, d in enumerate(out)]
    if None in dims:
        raise EmitError("reshape with a dynamic non-leading dimension is not emitted")
    return dims


def _squeeze(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(()) if t.numel() == 1 else t.reshape(-1)


def _value_info(name: str, val) -> onnx.ValueInfoProto:
    dims = [d if isinstance(d, int) else str(d) for d in val.shape]
    return helper.make_tensor_value_info(name, _DTYPE[val.dtype], dims)


def emit_cluster(gm: GraphModule, constants: dict[str, torch.Tensor]) -> tuple[onnx.ModelProto, list[str], list[str]]:
    """ONNX model of a fused cluster; returns (model, runtime input names, output names)."""
    e = Emitter(gm, constants)
    inputs, outputs = [], []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if node.name in constants:
                e.inits.append(numpy_helper.from_array(constants[node.name].detach().numpy(), node.name))
            else:
                inputs.append(_value_info(node.name, node.meta["val"]))
        elif node.op == "get_attr":
            e.inits.append(numpy_helper.from_array(constant_value(gm, node).detach().numpy(), node.name))
        elif node.op == "call_function":
            e.emit(node)
        elif node.op == "output":
            results = node.args[0] if isinstance(node.args[0], (tuple, list)) else (node.args[0],)
            for r in results:
                if not isinstance(r, Node):
                    raise EmitError("non-tensor cluster output")
                outputs.append(_value_info(r.name, r.meta["val"]))
    if e.deferred_conv:
        raise EmitError("internal: unfused conv left behind")
    shapes = {n.name: tuple(n.meta["val"].shape) for n in gm.graph.nodes
              if isinstance(n.meta.get("val"), torch.Tensor) and all(isinstance(d, int) for d in n.meta["val"].shape)}
    nodes, inits = flatten_rows(e.nodes, e.inits, shapes, {o.name for o in outputs})
    used = {i for n in nodes for i in n.input}
    inits = [t for t in inits if t.name in used]
    graph = helper.make_graph(nodes, "qlower_cluster", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.microsoft", 1),
                                                    helper.make_opsetid(BLOCK_DOMAIN, 1)],
                              functions=list(e.functions.values()), producer_name="qlower")
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model, [i.name for i in inputs], [o.name for o in outputs]


from .blockops import BLOCK_DOMAIN, BLOCK_LIKE_ATEN, emit_block_op  # noqa: E402  (these build on Emitter)
from .float_nn import FLOAT_NN  # noqa: E402
