import re

import pytest
import torch
from typer.testing import CliRunner

import qlower
from qlower.cli import app

runner = CliRunner()


def test_demo_prints_table_for_a_model():
    result = runner.invoke(app, ["demo", "--models", "cnn", "--runs", "1"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "cnn" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    # backend "auto" keeps the fastest correct engine, measured: which one wins depends on the
    # machine and its load (iree won once on a loaded CI run), so any engine, one cluster, no fallback
    assert cells[1] in ("onnxruntime", "openvino", "iree") and cells[2:5] == ["1", "0", "10/10"], cells
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


@pytest.mark.slow
def test_outputs_into_a_missing_folder(tmp_path):
    """`qlower verify --out` creates its report folder (like `qlower bench --out`); an export
    into a missing folder is a typed ArtifactError naming the path, never a raw
    FileNotFoundError, for every format."""
    import qlower
    from qlower.errors import ArtifactError
    from qlower.zoo import ZOO
    out = tmp_path / "new" / "reports" / "cnn.html"
    result = CliRunner().invoke(app, ["verify", "cnn", "--out", str(out), "--json", str(tmp_path / "j" / "r.json"),
                                      "--inputs", "1", "--calibration", "1", "--suggest", "1"])
    assert result.exit_code == 0, result.output
    assert out.exists() and (tmp_path / "j" / "r.json").exists()
    entry = ZOO["cnn"]
    cm = qlower.compile(entry.model(), entry.inputs(1), backend="onnxruntime")
    for fmt in ("onnx", "pt2"):
        target = tmp_path / "missing" / f"m.{fmt}"
        with pytest.raises(ArtifactError, match="cannot write"):
            qlower.export(cm, target, format=fmt)
        assert not target.parent.exists()
