"""One more ONNX graph output per checked input: its sum (NaN/inf propagate into it), so an
engine computes the NaN/inf check inside its own run (clusters.float_inputs says why clusters
check). Shared by the backends that run ONNX models (onnxruntime, openvino)."""
from __future__ import annotations


def with_input_sums(model_bytes: bytes, positions: list[int]) -> bytes:
    """The model plus one output per listed graph input: ReduceSum over all of it (NaN/inf
    propagate into the sum). Inside the session this costs ~1 us per input; the same sum taken
    in PyTorch before each run cost 16 us per call on the zoo LSTM (3 inputs; measured: the
    session ran ~10 us slower after any torch or numpy reduction, not only by the sums' own cost)."""
    import onnx
    model = onnx.load_from_string(model_bytes)
    graph = model.graph
    for k, pos in enumerate(positions):
        name = graph.input[pos].name
        out = f"qlower_input_sum_{k}"
        graph.node.append(onnx.helper.make_node("ReduceSum", [name], [out], keepdims=0, name=f"qlower_input_sum_{k}"))
        elem = graph.input[pos].type.tensor_type.elem_type
        graph.output.append(onnx.helper.make_tensor_value_info(out, elem, []))
    return model.SerializeToString()
