"""Smoke test of the bench harness: one model, two stacks, a couple of iterations. No timing
assertions: what is checked is that results, accuracy and outputs are produced."""
import json

from typer.testing import CliRunner

from qlower.cli import app


def test_bench_smoke(tmp_path):
    result = CliRunner().invoke(app, ["bench", "--models", "cnn", "--stacks", "eager-fp32,qlower-reference",
                                      "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "bench.json").read_text())
    rows = {r["stack"]: r for r in data["results"]}
    assert rows["eager-fp32"]["ok"] and rows["qlower-reference"]["ok"]
    assert rows["eager-fp32"]["vs_eager"] == 1.0
    assert rows["qlower-reference"]["sqnr_db"] > 20 and len(rows["qlower-reference"]["samples"]) == 2
    assert "| cnn | 1 | qlower-reference |" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "bench.png").stat().st_size > 1000


def test_bench_records_a_failing_stack_instead_of_crashing(tmp_path):
    result = CliRunner().invoke(app, ["bench", "--models", "cnn", "--stacks", "eager-fp32,no-such-stack",
                                      "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0
    rows = {r["stack"]: r for r in json.loads((tmp_path / "bench.json").read_text())["results"]}
    assert not rows["no-such-stack"]["ok"] and "unknown stack" in rows["no-such-stack"]["error"]
