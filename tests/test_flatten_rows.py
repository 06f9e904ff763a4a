"""FlattenRows (onnx/flatten_rows.py): the Reshape pairs around 2-D QGemms
cancel across row-wise ops; values on every output stay identical."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qlower.onnx.flatten_rows import flatten_rows

B, S, N = 2, 4, 8


def _inits():
    rng = np.random.default_rng(0)
    arrays = {"one": np.float32(1.0), "sx": np.float32(0.05), "zx": np.uint8(128),
              "w1": rng.integers(-60, 60, (N, N)).astype(np.int8),
              "w2": rng.integers(-60, 60, (N, N)).astype(np.int8), "ws": np.float32(0.002), "wz": np.int8(0),
              "sy": np.float32(0.04), "zy": np.uint8(120), "b": rng.integers(-500, 500, N).astype(np.int32),
              "rows": np.array([-1, N], np.int64), "cube": np.array([B, S, N], np.int64),
              "g": np.ones(N, np.float32), "beta": np.zeros(N, np.float32), "pc": np.full(N, 0.04, np.float32),
              "pz": np.full(N, 120, np.uint8)}
    return [numpy_helper.from_array(np.asarray(v), k) for k, v in arrays.items()]


def _qgemm(x, w, y):
    return [helper.make_node("QGemm", [x, "sx", "zx", w, "ws", "wz", "b", "sy", "zy"], [y], domain="com.microsoft")]


def _block(ln_axis=-1, per_channel_dq=False):
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("Reshape", ["xq", "rows"], ["xr"]), *_qgemm("xr", "w1", "y2"),
             helper.make_node("Reshape", ["y2", "cube"], ["y"]),
             helper.make_node("QLinearAdd", ["y", "sy", "zy", "xq", "sx", "zx", "sy", "zy"], ["s"],
                              domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["s", "pc", "pz"] if per_channel_dq else ["s", "sy", "zy"], ["sd"],
                              **({"axis": 2} if per_channel_dq else {})),
             helper.make_node("LayerNormalization", ["sd", "g", "beta"], ["ln"], axis=ln_axis),
             helper.make_node("QuantizeLinear", ["ln", "sx", "zx"], ["lq"]),
             helper.make_node("Reshape", ["lq", "rows"], ["lr"]), *_qgemm("lr", "w2", "z2"),
             helper.make_node("Reshape", ["z2", "cube"], ["z"]),
             helper.make_node("DequantizeLinear", ["z", "sy", "zy"], ["out"])]
    shapes = {"x": (B, S, N), "xq": (B, S, N), "out": (B, S, N)}
    return nodes, shapes


def _run(nodes, inits):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, N])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [B, S, N])], inits)
    m = helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 23),
                                                           helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    x = np.random.default_rng(1).standard_normal((B, S, N)).astype(np.float32)
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _copy(nodes):
    out = []
    for n in nodes:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        out.append(c)
    return out


def test_reshape_pairs_cancel_and_values_are_identical():
    nodes, shapes = _block()
    before = _run(_copy(nodes), _inits())
    new_nodes, new_inits = flatten_rows(_copy(nodes), _inits(), shapes, {"out"})
    ops = [n.op_type for n in new_nodes]
    assert ops.count("Reshape") == 2  # x to rows once, the final unflatten; 4 before
    assert np.array_equal(_run(new_nodes, new_inits), before)
    again, _ = flatten_rows(_copy(new_nodes), new_inits, shapes, {"out"})  # idempotent
    assert [n.op_type for n in again] == ops


@pytest.mark.parametrize("kw", [{"ln_axis": 1}, {"per_channel_dq": True}],
                         ids=["layernorm-not-last-axis", "per-channel-dq"])
def test_near_misses_keep_their_reshapes(kw):
    nodes, shapes = _block(**kw)
    before = _run(_copy(nodes), _inits())
    new_nodes, new_inits = flatten_rows(_copy(nodes), _inits(), shapes, {"out"})
    stuck = [n for n in new_nodes if n.op_type in ("LayerNormalization", "DequantizeLinear")
             and any(i == "sd" or i == "s" for i in n.input)]
    assert stuck  # the op that is not row-wise still reads the 3-D value
    assert np.array_equal(_run(new_nodes, new_inits), before)
