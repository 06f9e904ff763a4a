"""ONNX formulations that OpenVINO's CPU plugin computes exactly (each measured against the
reference kernels; docs/openvino.md); the openvino backend and the standard-op ONNX export both
run them. `legalize(model)` runs the three integer rewrites; `ieee_softmax(model)` runs on every
model.

Quantized add / mul (DequantizeLinear x2 -> Add/Mul -> QuantizeLinear, 8-bit): OpenVINO's
QuantizeLinear multiplies by fp32(1/s) instead of dividing (1-LSB differences). The result is a
function of two 8-bit values, so it becomes a 256 x 256 lookup table computed by qlower's own
canonical kernel: Gather(table, (a - lo) * 256 + (b - lo)). Exact by construction.

QuantizeLinear with a power-of-two scale (requantize's Cast(acc) -> Mul(M) -> QuantizeLinear(1,
zp), the integer mean's, a quantize whose scale is 2^k): OpenVINO adds the zero point before
rounding (ties of odd zero points go the wrong way) and folds a preceding multiply into its
FakeQuantize, re-associating (measured: 12 of 6.5M requantized values off by one). Mul(2^-k) ->
Round -> Add(zp) -> Clip -> Cast computes RNE(x / 2^k) + zp as written (0 of 6.5M).

Softmax / LogSoftmax: OpenVINO's kernels give NaN only at a row's NaN / +inf elements and 0
(-inf) at the others, where PyTorch's whole row is NaN (measured: [inf, -inf, -inf] -> [nan, 0,
0], [1, 2, inf] -> [0, 0, nan], [nan, 1, 2] -> [nan, 0, 0]). `ieee_softmax` adds
0 * ReduceSum(row) (Softmax) or 0 * ReduceSum(Exp(row)) (LogSoftmax) to the output: 0 for a
finite row (y + 0 == y bit for bit), NaN across a row holding one. Runs on every profile.

DequantizeLinear: OpenVINO's ONNX frontend turns it into Convert -> Subtract -> Multiply and its
transformations fold that into q*s - zp*s (measured: 3,921 of 7,680 values differ from the
canonical fp32(q - zp) * s by an ulp, and DQ(zp) came out 9.3e-10, not 0). Subtracting the zero
point in int32 before the conversion leaves nothing to fold: Cast(int32) -> Sub(zp) ->
Cast(float) -> Mul(s) measured equal on every input (docs/openvino.md)."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from .. import numerics


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _shaped(v: np.ndarray, axis: int | None, rank: int | None) -> np.ndarray | None:
    """A per-axis vector reshaped to broadcast along `axis` (None when the rank is unknown)."""
    if v.ndim == 0 or v.size == 1:
        return v.reshape(())
    if rank is None or axis is None:
        return None
    shape = [1] * rank
    shape[axis % rank] = v.size
    return v.reshape(shape)


def _ranks(graph: onnx.GraphProto) -> dict[str, int]:
    out = {}
    for vi in [*graph.value_info, *graph.input, *graph.output]:
        if vi.type.tensor_type.HasField("shape"):
            out[vi.name] = len(vi.type.tensor_type.shape.dim)
    return out


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in graph.node for o in n.output}


def _consumers(graph: onnx.GraphProto) -> dict[str, int]:
    uses: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    for o in graph.output:
        uses[o.name] = uses.get(o.name, 0) + 1
    return uses


def _scalar_qparams(consts, node) -> tuple[float, int, np.dtype] | None:
    """(scale, zero point, zp dtype) of a Q/DQ node with constant scalar qparams."""
    if len(node.input) < 3:
        return None
    s, z = consts.get(node.input[1]), consts.get(node.input[2])
    if s is None or z is None or s.size != 1 or z.size != 1 or z.dtype not in (np.uint8, np.int8):
        return None
    return float(s.reshape(())), int(z.reshape(())), z.dtype


_TORCH = {np.dtype(np.uint8): "uint8", np.dtype(np.int8): "int8"}


def _replaced(graph: onnx.GraphProto, nodes: list, inits: list, rewritten: int) -> int:
    """A rewrite's end: where it rewrote anything, the graph's nodes become `nodes` (in order)
    and `inits` join its initializers. Returns `rewritten`."""
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
        graph.initializer.extend(inits)
    return rewritten


def _table(op: str, qa, qb, qy) -> np.ndarray:
    """y[i * 256 + j] = qlower's canonical add/mul of a = i + lo_a, b = j + lo_b."""
    import torch
    dt = {k: getattr(torch, v) for k, v in _TORCH.items()}
    a_lo, b_lo = numerics.dtype_range(dt[qa[2]])[0], numerics.dtype_range(dt[qb[2]])[0]
    a = (torch.arange(256) + a_lo).to(dt[qa[2]])[:, None].expand(256, 256)
    b = (torch.arange(256) + b_lo).to(dt[qb[2]])[None, :].expand(256, 256)
    y_dt = dt[qy[2]]
    lo, hi = numerics.dtype_range(y_dt)
    fn = getattr(torch.ops.qlower, op.lower())
    y = fn(a.contiguous(), qa[0], qa[1], b.contiguous(), qb[0], qb[1], qy[0], qy[1], lo, hi, y_dt)
    return y.reshape(-1).numpy()


def table_add_mul(model: onnx.ModelProto) -> int:
    """DQ(a), DQ(b) -> Add|Mul -> QuantizeLinear (8-bit, scalar qparams, the sum used only by
    the quantize) => Gather from the 65,536-entry table of the canonical results."""
    graph = model.graph
    consts, prod, uses = _constants(graph), _producers(graph), _consumers(graph)
    replace: dict[int, list] = {}
    drop: set[int] = set()
    inits = []
    index = {id(n): i for i, n in enumerate(graph.node)}
    for qnode in graph.node:
        if qnode.op_type != "QuantizeLinear":
            continue
        arith = prod.get(qnode.input[0])
        if arith is None or arith.op_type not in ("Add", "Mul") or uses.get(arith.output[0]) != 1:
            continue
        dqs = [prod.get(i) for i in arith.input]
        if len(dqs) != 2 or any(d is None or d.op_type != "DequantizeLinear" for d in dqs):
            continue
        qa, qb, qy = (_scalar_qparams(consts, n) for n in (*dqs, qnode))
        if qa is None or qb is None or qy is None:
            continue
        base = f"{qnode.output[0]}__ovtable"
        table = _table(arith.op_type, qa, qb, qy)
        inits += [numpy_helper.from_array(table, f"{base}_t"),
                  numpy_helper.from_array(np.array(-128 if qa[2] == np.int8 else 0, np.int32), f"{base}_alo"),
                  numpy_helper.from_array(np.array(-128 if qb[2] == np.int8 else 0, np.int32), f"{base}_blo"),
                  numpy_helper.from_array(np.array(256, np.int32), f"{base}_256")]
        new = [helper.make_node("Cast", [dqs[0].input[0]], [f"{base}_a"], to=TensorProto.INT32),
               helper.make_node("Cast", [dqs[1].input[0]], [f"{base}_b"], to=TensorProto.INT32),
               helper.make_node("Sub", [f"{base}_a", f"{base}_alo"], [f"{base}_a0"]),
               helper.make_node("Sub", [f"{base}_b", f"{base}_blo"], [f"{base}_b0"]),
               helper.make_node("Mul", [f"{base}_a0", f"{base}_256"], [f"{base}_row"]),
               helper.make_node("Add", [f"{base}_row", f"{base}_b0"], [f"{base}_i"]),
               helper.make_node("Gather", [f"{base}_t", f"{base}_i"], [qnode.output[0]], axis=0)]
        replace[index[id(qnode)]] = new
        drop.add(index[id(arith)])
        for d in dqs:   # a DQ with other users stays (it is then rewritten by exact_dequantize)
            if uses.get(d.output[0]) == 1:
                drop.add(index[id(d)])
    if not replace:
        return 0
    nodes = []
    for i, n in enumerate(graph.node):
        if i in replace:
            nodes += replace[i]
        elif i not in drop:
            nodes.append(n)
    return _replaced(graph, nodes, inits, len(replace))


def _power_of_two(v: float) -> bool:
    m, e = math.frexp(v)
    return m == 0.5 and -125 <= e - 1 <= 125


def exact_quantize(model: onnx.ModelProto) -> int:
    """QuantizeLinear with a scalar power-of-two scale (requantize's and mean's scale 1 included)
    => Mul(1/s) -> Round -> Add(zp) -> Clip -> Cast, NaN -> qmin (the canonical rule) unless the
    input comes from an integer. OpenVINO's own QuantizeLinear adds the zero point before
    rounding (ties go the wrong way for odd zero points: measured) and folds a preceding
    multiply into its FakeQuantize (12 of 6.5M requantized values off by one)."""
    graph = model.graph
    consts, prod = _constants(graph), _producers(graph)
    nodes, inits, rewritten = [], [], 0
    for node in graph.node:
        qp = _scalar_qparams(consts, node) if node.op_type == "QuantizeLinear" else None
        if qp is None or not _power_of_two(qp[0]):
            nodes.append(node)
            continue
        src = prod.get(node.input[0])
        cast = prod.get(src.input[0]) if src is not None and src.op_type in ("Mul", "Div") else None
        finite = cast is not None and cast.op_type == "Cast"    # Cast(integer) -> Mul/Div: no NaN
        lo, hi = (0, 255) if qp[2] == np.uint8 else (-128, 127)
        base = f"{node.output[0]}__ovq"
        inits += [numpy_helper.from_array(np.array(qp[1], np.float32), f"{base}_z"),
                  numpy_helper.from_array(np.array(lo, np.float32), f"{base}_lo"),
                  numpy_helper.from_array(np.array(hi, np.float32), f"{base}_hi")]
        x = node.input[0]
        if qp[0] != 1.0:
            inits.append(numpy_helper.from_array(np.array(1.0 / qp[0], np.float32), f"{base}_inv"))
            nodes.append(helper.make_node("Mul", [x, f"{base}_inv"], [f"{base}_x"]))   # exact: 2^-k
            x = f"{base}_x"
        nodes += [helper.make_node("Round", [x], [f"{base}_r"]),
                  helper.make_node("Add", [f"{base}_r", f"{base}_z"], [f"{base}_a"]),
                  helper.make_node("Clip", [f"{base}_a", f"{base}_lo", f"{base}_hi"], [f"{base}_c"])]
        y = f"{base}_c"
        if not finite:
            nodes += [helper.make_node("IsNaN", [node.input[0]], [f"{base}_nan"]),
                      helper.make_node("Where", [f"{base}_nan", f"{base}_lo", y], [f"{base}_w"])]
            y = f"{base}_w"
        to = TensorProto.UINT8 if qp[2] == np.uint8 else TensorProto.INT8
        nodes.append(helper.make_node("Cast", [y], [node.output[0]], to=to))
        rewritten += 1
    return _replaced(graph, nodes, inits, rewritten)


def ieee_softmax(model: onnx.ModelProto) -> int:
    """Softmax / LogSoftmax y in the main graph -> y + 0 * ReduceSum(row of y or Exp(y)), so a
    row with one NaN is NaN throughout as in PyTorch. Returns how many were rewritten."""
    graph = model.graph
    nodes, rewritten = [], 0
    for node in graph.node:
        if node.op_type not in ("Softmax", "LogSoftmax"):
            nodes.append(node)
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        out, base = node.output[0], f"{node.output[0]}__ovieee"
        row = f"{base}_exp" if node.op_type == "LogSoftmax" else f"{base}_y"
        nodes.append(helper.make_node(node.op_type, list(node.input), [f"{base}_y"], name=node.name,
                                      axis=axis))
        if node.op_type == "LogSoftmax":   # its -inf entries are legitimate (exp -> 0)
            nodes.append(helper.make_node("Exp", [f"{base}_y"], [row]))
        nodes += [helper.make_node("Constant", [], [f"{base}_axis"], value=numpy_helper.from_array(
                      np.array([axis], np.int64))),
                  helper.make_node("Constant", [], [f"{base}_zero"], value=numpy_helper.from_array(
                      np.array(0, np.float32))),
                  helper.make_node("ReduceSum", [row, f"{base}_axis"], [f"{base}_sum"], keepdims=1),
                  helper.make_node("CastLike", [f"{base}_zero", f"{base}_sum"], [f"{base}_zero_t"]),
                  helper.make_node("Mul", [f"{base}_sum", f"{base}_zero_t"], [f"{base}_nan"]),
                  helper.make_node("Add", [f"{base}_y", f"{base}_nan"], [out])]
        rewritten += 1
    return _replaced(graph, nodes, [], rewritten)


def legalize(model: onnx.ModelProto) -> dict[str, int]:
    """All exact-integer rewrites, in order (the table rewrite consumes its DequantizeLinears first)."""
    return {"add/mul -> lookup table": table_add_mul(model),
            "QuantizeLinear (power-of-two scale) -> Round/Add/Clip/Cast": exact_quantize(model),
            "DequantizeLinear -> int32 Sub, Mul": exact_dequantize(model)}


def exact_dequantize(model: onnx.ModelProto) -> int:
    """Rewrite DequantizeLinear (constant scale / zero point, int8/uint8 input) in the main graph
    as Cast(int32) - zp -> Cast(float) * s. Returns how many were rewritten."""
    graph = model.graph
    consts, ranks = _constants(graph), _ranks(graph)
    nodes, inits, rewritten = [], [], 0
    for node in graph.node:
        if node.op_type != "DequantizeLinear" or len(node.input) < 2:
            nodes.append(node)
            continue
        scale = consts.get(node.input[1])
        zp = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.int32)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        rank = ranks.get(node.input[0])
        if scale is None or zp is None or scale.dtype != np.float32 or zp.dtype not in (np.int8, np.uint8, np.int32):
            nodes.append(node)
            continue
        s, z = _shaped(scale, axis, rank), _shaped(zp.astype(np.int32), axis, rank)
        if s is None or z is None:
            nodes.append(node)
            continue
        base = f"{node.output[0]}__ovdq"
        inits += [numpy_helper.from_array(np.ascontiguousarray(s), f"{base}_s"),
                  numpy_helper.from_array(np.ascontiguousarray(z), f"{base}_z")]
        nodes += [helper.make_node("Cast", [node.input[0]], [f"{base}_i"], to=TensorProto.INT32),
                  helper.make_node("Sub", [f"{base}_i", f"{base}_z"], [f"{base}_c"]),
                  helper.make_node("Cast", [f"{base}_c"], [f"{base}_f"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", [f"{base}_f", f"{base}_s"], [node.output[0]])]
        rewritten += 1
    return _replaced(graph, nodes, inits, rewritten)
