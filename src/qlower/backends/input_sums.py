"""One more ONNX graph output: the sum of the checked inputs' sums (NaN/inf in any of them
propagate into it), so an engine computes the NaN/inf check inside its own run (clusters.float_inputs
says why clusters check). Shared by the backends that run ONNX models (onnxruntime, openvino)."""
from __future__ import annotations

INPUT_SUM = "qlower_input_sum"


def with_input_sums(model_bytes: bytes, positions: list[int]) -> bytes:
    """The model plus one scalar output, INPUT_SUM: ReduceSum over each listed graph input, added
    up (Sum). One output, not one per input: each extra output cost ~2 us per call on the zoo LSTM
    (3 inputs, AMD EPYC Zen 1, one thread: three outputs +18.6 us, one +14.2 us over none). The
    same sums taken in PyTorch or numpy before the run cost more (+21 us for one numpy sum of
    800 floats: the session ran slower after any torch or numpy reduction, not only by its cost)."""
    import onnx
    model = onnx.load_from_string(model_bytes)
    graph = model.graph
    sums = []
    for k, pos in enumerate(positions):
        out = INPUT_SUM if len(positions) == 1 else f"{INPUT_SUM}_{k}"
        graph.node.append(onnx.helper.make_node("ReduceSum", [graph.input[pos].name], [out], keepdims=0, name=out))
        sums.append(out)
    if len(sums) > 1:
        graph.node.append(onnx.helper.make_node("Sum", sums, [INPUT_SUM], name=INPUT_SUM))
    elem = graph.input[positions[0]].type.tensor_type.elem_type
    graph.output.append(onnx.helper.make_tensor_value_info(INPUT_SUM, elem, []))
    return model.SerializeToString()
