import re

import torch
from typer.testing import CliRunner

import qlower
from qlower.cli import app

runner = CliRunner()


def test_demo_prints_table_for_a_model():
    result = runner.invoke(app, ["demo", "--models", "cnn", "--runs", "1"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "cnn" in line)
    assert "onnxruntime" in row and "10/10" in row
    sqnr = float(re.findall(r"│\s+([\d.]+)\s+│\s+0\.99", row)[0])
    assert sqnr > 25


def test_demo_unknown_model_is_a_clean_error():
    result = runner.invoke(app, ["demo", "--models", "resnet1000"])
    assert result.exit_code == 2
    assert "unknown zoo model" in result.output and "Traceback" not in result.output


def test_schema_and_inspect(tmp_path, small_net):
    x = torch.randn(1, 3, 8, 8)
    path = qlower.save_pt2(qlower.capture(small_net, (x,)), tmp_path / "m.pt2")
    result = runner.invoke(app, ["schema", str(path)])
    assert result.exit_code == 0
    assert "aten::conv2d(Tensor input, Tensor weight" in result.output
    cm = qlower.compile(small_net, (x,), quantize="int8", calibration=[(x,)], backend="reference")
    art = cm.save(tmp_path / "cm.pt2")
    result = runner.invoke(app, ["inspect", str(art)])
    assert result.exit_code == 0 and "qlower.conv2d" in result.output and "backend: reference" in result.output
