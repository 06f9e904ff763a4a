"""Smoke test of the bench harness: one model, two stacks, a couple of iterations. No timing
assertions: what is checked is that results, accuracy and outputs are produced."""
import json

from typer.testing import CliRunner

from qlower.cli import app


def test_bench_smoke(tmp_path):
    result = CliRunner().invoke(app, ["bench", "--models", "cnn", "--stacks",
                                      "eager-fp32,qlower-reference,qlower-onnxruntime,qlower-onnxruntime-qdq",
                                      "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "bench.json").read_text())
    rows = {r["stack"]: r for r in data["results"]}
    assert all(r["ok"] for r in rows.values()), rows
    # exactness against the reference backend on the same quantized program: the CNN is all
    # integer ops, so the onnxruntime stack must match on every element; peers are not measured
    assert rows["qlower-reference"]["canonical_diff"] == 0 and rows["qlower-onnxruntime"]["canonical_diff"] == 0
    assert rows["eager-fp32"]["canonical_diff"] is None and rows["qlower-onnxruntime-qdq"]["canonical_diff"] is not None
    assert set(data["qlower_vs_best_peer"]) == set() == set(data["qlower_vs_peers_paired"])  # no non-eager peer
    assert rows["eager-fp32"]["vs_eager"] == 1.0
    assert rows["qlower-reference"]["sqnr_db"] > 20 and len(rows["qlower-reference"]["samples"]) == 2
    assert "| cnn | 1 | qlower-reference |" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "bench.png").stat().st_size > 1000


def test_paired_ratios_pair_samples_of_the_same_round():
    from qlower.bench import StackResult, paired_ratios
    ours = StackResult("m", "qlower-onnxruntime", True, median_ms=2.0, samples=[1.0, 2.0, 9.0])
    slow_machine_phase = StackResult("m", "ort-int8-qdq", True, median_ms=4.0, samples=[2.0, 4.0, 18.0])
    qdq = StackResult("m", "qlower-onnxruntime-qdq", True, median_ms=0.1, samples=[0.1, 0.1, 0.1])  # not canonical
    assert paired_ratios([ours, slow_machine_phase, qdq]) == {"m b1": {"ort-int8-qdq": 0.5}}


def test_bench_records_a_failing_stack_instead_of_crashing(tmp_path):
    result = CliRunner().invoke(app, ["bench", "--models", "cnn", "--stacks", "eager-fp32,no-such-stack",
                                      "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0
    rows = {r["stack"]: r for r in json.loads((tmp_path / "bench.json").read_text())["results"]}
    assert not rows["no-such-stack"]["ok"] and "unknown stack" in rows["no-such-stack"]["error"]
