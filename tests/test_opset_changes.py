"""The opset-18 -> OPSET adapter for the two ops whose schema changed at opset 20 (DFT's axis,
GridSample's mode names): contract and numerics on ONNX Runtime."""
from __future__ import annotations

import onnx_ir as ir
import pytest
import torch
import torch.nn.functional as F

import qlower
from conftest import Fn
from qlower.onnx.opset_changes import upgrade_opset_18_nodes


def _model(op_type: str, n_inputs: int, **attributes) -> ir.Model:
    inputs = [ir.Value(name=f"in{i}", type=ir.TensorType(ir.DataType.FLOAT)) for i in range(n_inputs)]
    node = ir.node(op_type, inputs, attributes=attributes, num_outputs=1)
    graph = ir.Graph(inputs, node.outputs, nodes=[node], opset_imports={"": 23})
    return ir.Model(graph, ir_version=10)


def _only(model: ir.Model, op_type: str):
    return next(n for n in model.graph if n.op_type == op_type)


def test_dft_axis_attribute_becomes_an_input():
    model = _model("DFT", 1, axis=2, inverse=1, onesided=0)
    assert upgrade_opset_18_nodes(model) == 1
    dft = _only(model, "DFT")
    assert "axis" not in dft.attributes and dft.attributes["inverse"].as_int() == 1
    assert len(dft.inputs) == 3 and dft.inputs[1] is None
    assert int(dft.inputs[2].producer().attributes["value"].as_tensor().numpy()) == 2
    assert upgrade_opset_18_nodes(model) == 0   # idempotent


def test_dft_without_axis_gets_opset_17s_default_not_opset_20s():
    model = _model("DFT", 2)   # opset 17: axis 1; opset 20 would read a missing axis as -2
    upgrade_opset_18_nodes(model)
    dft = _only(model, "DFT")
    assert dft.inputs[1].name == "in1"   # dft_length kept
    assert int(dft.inputs[2].producer().attributes["value"].as_tensor().numpy()) == 1


@pytest.mark.parametrize("old, new", [("bilinear", "linear"), ("bicubic", "cubic")])
def test_grid_sample_mode_renamed(old, new):
    model = _model("GridSample", 2, mode=old, align_corners=1)
    assert upgrade_opset_18_nodes(model) == 1
    assert _only(model, "GridSample").attributes["mode"].as_string() == new
    assert upgrade_opset_18_nodes(model) == 0


def test_near_misses_are_left_alone():
    for model in (_model("GridSample", 2, mode="nearest"), _model("GridSample", 2),
                  _model("DFT", 3), _model("Add", 2)):
        before = [(n.op_type, dict(n.attributes), len(n.inputs)) for n in model.graph]
        assert upgrade_opset_18_nodes(model) == 0
        assert [(n.op_type, dict(n.attributes), len(n.inputs)) for n in model.graph] == before


@pytest.mark.parametrize("fn", [lambda x: torch.fft.irfft(x), lambda x: torch.fft.irfft(x, n=7, dim=0),
                                lambda x: torch.fft.hfft(x, norm="ortho"), lambda x: torch.fft.irfftn(x)],
                         ids=["irfft", "irfft-n-dim0", "hfft-ortho", "irfftn"])
def test_real_fft_inverses_run_in_onnxruntime(fn):
    x = torch.randn(4, 6)
    cm = qlower.compile(Fn(fn), (x,), backend="onnxruntime")
    assert not cm.report().fallbacks
    torch.testing.assert_close(cm(x), fn(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "nearest"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_runs_in_onnxruntime(mode, align_corners):
    gen = torch.Generator().manual_seed(0)
    x, grid = torch.randn(1, 2, 5, 6, generator=gen), torch.rand(1, 4, 3, 2, generator=gen) * 2.4 - 1.2
    fn = lambda x, g: F.grid_sample(x, g, mode=mode, align_corners=align_corners)  # noqa: E731
    cm = qlower.compile(Fn(lambda a: fn(a, grid)), (x,), backend="onnxruntime")
    assert not cm.report().fallbacks
    torch.testing.assert_close(cm(x), fn(x, grid), atol=1e-5, rtol=1e-5)
