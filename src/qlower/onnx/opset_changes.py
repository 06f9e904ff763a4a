"""torchlib writes opset-18 nodes; a cluster's model imports the standard domain at OPSET (23,
for qlower's block ops). For almost every op the meaning is unchanged (later opsets add types
and attributes), but two ops that torchlib emits changed at opset 20 in a way that makes the
opset-18 node invalid under a newer import:

- DFT: the `axis` attribute (default 1) became an optional input (default -2). ONNX Runtime
  rejects every such torch.fft.irfft / hfft cluster ("Unrecognized attribute: axis").
- GridSample: `mode` "bilinear" / "bicubic" were renamed "linear" / "cubic". ONNX Runtime
  rejects every such grid_sample cluster at session creation.

Contract (one pass over the model, its functions and subgraphs):
  pre   nodes written for opset 18, the model declaring OPSET >= 20
  BEFORE  DFT(x, n) {axis=a}             GridSample(x, g) {mode="bilinear"}
  AFTER   DFT(x, n, Constant(a))         GridSample(x, g) {mode="linear"}
  post  every DFT / GridSample node valid at OPSET with the opset-18 meaning; idempotent (an
        upgraded node has no `axis` attribute and no old mode name left)."""
from __future__ import annotations

# GridSample-16 mode -> GridSample-20 mode (the same interpolation)
_GRID_SAMPLE_MODES = {"bilinear": "linear", "bicubic": "cubic"}
_DFT_17_DEFAULT_AXIS = 1


def upgrade_opset_18_nodes(model) -> int:
    """Rewrite the opset-18 DFT and GridSample nodes of `model` (onnx_ir) for the opset-20 schema;
    returns how many nodes changed."""
    import onnx_ir as ir
    changed = 0
    graphs = [model.graph, *model.functions.values()]
    for graph in graphs:
        for node in list(ir.traversal.RecursiveGraphIterator(graph)):
            if node.domain not in ("", "ai.onnx"):
                continue
            if node.op_type == "DFT" and _dft_axis_as_input(node):
                changed += 1
            elif node.op_type == "GridSample" and _grid_sample_mode_renamed(node):
                changed += 1
    return changed


def _dft_axis_as_input(node) -> bool:
    import numpy as np
    import onnx_ir as ir
    attr = node.attributes.get("axis")
    if attr is None and len(node.inputs) >= 3:
        return False   # already opset-20 form
    axis = attr.as_int() if attr is not None else _DFT_17_DEFAULT_AXIS
    constant = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(axis, dtype=np.int64))},
                       num_outputs=1)
    constant.outputs[0].name = f"{node.name or 'dft'}__axis"
    node.graph.insert_before(node, constant)
    node.resize_inputs(3)   # (input, dft_length: kept or absent, axis)
    node.replace_input_with(2, constant.outputs[0])
    if attr is not None:
        del node.attributes["axis"]
    return True


def _grid_sample_mode_renamed(node) -> bool:
    import onnx_ir as ir
    mode = node.attributes.get("mode")
    if mode is None or mode.as_string() not in _GRID_SAMPLE_MODES:
        return False
    node.attributes["mode"] = ir.AttrString("mode", _GRID_SAMPLE_MODES[mode.as_string()])
    return True
