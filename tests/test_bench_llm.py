"""`qlower bench --suite llm` (bench/llm.py) on a tiny random LLaMA: the rows, the floor, the
functional step the ONNX peers run, the suite's registration."""
import pytest
import torch

pytest.importorskip("transformers")

from qlower.bench import llm, suites  # noqa: E402
from qlower.generate import CompiledLM, lm_step  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return llm.build_model("tiny-llama")


def test_run_times_each_stack_and_reports_the_unrunnable_with_a_reason(tiny):
    results, info = llm.run_llm(["tiny-llama"], ("eager-fp32", "qlower-no-such-preset", "bogus-stack"), (1, 2),
                                prompt=8, new=4, rounds=2, bandwidth_gbs=10.0, log=lambda m: None)
    rows = {(r.stack, r.batch): r for r in results}
    assert len(results) == 6
    for batch in (1, 2):
        eager = rows["eager-fp32", batch]
        assert eager.ok and len(eager.samples) == 2 and all(calls == 4 for _, _, calls in eager.samples)
        assert eager.prefill_tps > 0 and eager.decode_tps > 0 and eager.decode_vs_eager == 1.0
        assert eager.same_tokens == 5   # 4 decode steps after the prefill's token
        assert eager.floor_ms == pytest.approx(llm.floor_ms(llm.weight_params(tiny.lm), 32, 10.0))
        preset = rows["qlower-no-such-preset", batch]
        assert not preset.ok and preset.skipped and "not a preset" in preset.error
        bogus = rows["bogus-stack", batch]
        assert not bogus.ok and not bogus.skipped and "unknown LLM bench stack" in bogus.error
    text = llm.table(results, info)
    assert "| tiny-llama | 2 | eager-fp32 |" in text and "skipped: quantize='no-such-preset'" in text
    assert "GB/s" in text and "CPU:" in text


def test_functional_step_computes_the_stateful_steps_logits(tiny):
    """The ONNX peers' model (KV cache as inputs/outputs) gives the compiled step's logits."""
    lm, max_len = tiny.lm, 16
    ids = tiny.prompt_ids(2, 6)
    stateful = CompiledLM(lm_step(lm, 2, max_len), 2, max_len, padding=True)
    want = stateful.generate(ids, max_new_tokens=5)[:, 6:]
    runner = llm.FunctionalRunner(lambda feed: [t.numpy() for t in step(**{k: torch.from_numpy(v) for k, v in
                                                                            feed.items()})],
                                  lm, 2, max_len, lm.config.num_hidden_layers)
    step_module = llm.FunctionalStep(lm).eval()

    def step(token_ids, position_ids, **kv):
        with torch.no_grad():
            return step_module(token_ids, position_ids, *kv.values())
    got, _, _, calls = runner.generate(ids, 5)
    assert calls == 4 and got.tolist() == want.tolist()


def test_floor_and_group_size():
    # 1e9 4-bit weights in groups of 128 (a 4-byte scale + zero point each) at 10 GB/s
    assert llm.floor_ms(10**9, 4, 10.0, group=128) == pytest.approx((0.5 + 4 / 128) * 1e9 / 1e10 * 1e3)
    assert llm.floor_ms(10**9, 32, 10.0) == pytest.approx(400.0)
    smol_like = torch.nn.Sequential(torch.nn.Linear(576, 1536), torch.nn.Linear(1536, 576))
    assert llm.group_size(smol_like) == 64 and llm.group_size(torch.nn.Linear(1024, 8)) == 128
    assert llm.copy_bandwidth(mb=8, repeats=2) > 0.1


def test_llm_suite_is_registered():
    suite = suites.get("llm")
    assert suite.runner is llm.run_suite and suite.stacks == llm.LLM_STACKS
    assert suite.plan() == [("smollm2-135m", 1), ("smollm2-135m", 4)]


@pytest.mark.slow
def test_onnx_peers_build_and_generate(tiny, tmp_path):
    results, _ = llm.run_llm(["tiny-llama"], ("eager-fp32", "ort-int4"), (1,), prompt=8, new=4, rounds=1,
                             bandwidth_gbs=10.0, log=lambda m: None, workdir=str(tmp_path))
    ort = next(r for r in results if r.stack == "ort-int4")
    assert ort.ok and ort.decode_tps > 0 and ort.same_tokens is not None


@pytest.mark.slow
def test_gguf_file_gives_llama_cpp_the_models_logits(tmp_path):
    """write_gguf: llama.cpp (F32 weights) computes transformers' logits. q/k are scaled up so
    attention is sharp: without the rotary row reordering the logits move by ~0.5 of 0.73."""
    pytest.importorskip("llama_cpp")
    from qlower.zoo import smollm2
    if not smollm2.available():
        pytest.skip(smollm2.INSTALL_HINT)
    model = llm.build_model("tiny-llama")
    with torch.no_grad():
        for layer in model.lm.model.layers:
            layer.self_attn.q_proj.weight.mul_(30)
            layer.self_attn.k_proj.weight.mul_(30)
    path = llm.write_gguf(model.lm, tmp_path / "tiny.gguf", smollm2.gguf_path(), qtype="F32")
    ids = model.prompt_ids(1, 12)
    with torch.no_grad():
        want = model.lm(ids).logits[0, -1].numpy()
    runner = llm.LlamaCppRunner(path, 64)
    runner.llm.eval(ids[0].tolist())
    got = runner._last_logits()
    assert abs(got - want).max() < 5e-3 * abs(want).max() and got.argmax() == want.argmax()


@pytest.mark.slow
def test_gguf_file_holds_quantized_weights_in_llama_cpp_order(tmp_path):
    """write_gguf with a quantized type (what the bench writes for a random-weight model): each
    2-D weight is the gguf package's own Q4_0 / Q8_0 of it, in llama.cpp's [inputs, outputs]
    order; norms stay F32."""
    gguf = pytest.importorskip("gguf")
    from qlower.zoo import smollm2
    if not smollm2.available():
        pytest.skip(smollm2.INSTALL_HINT)
    model = llm.build_model("tiny-llama")
    for qtype in ("Q4_0", "Q8_0"):
        path = llm.write_gguf(model.lm, tmp_path / f"tiny-{qtype}.gguf", smollm2.gguf_path(), qtype=qtype)
        tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
        kind = gguf.GGMLQuantizationType[qtype]
        for name, weight in (("token_embd.weight", model.lm.model.embed_tokens.weight),
                             ("blk.0.ffn_down.weight", model.lm.model.layers[0].mlp.down_proj.weight)):
            t = tensors[name]
            w = weight.detach().float().numpy()
            assert t.tensor_type == kind and list(t.shape) == [w.shape[1], w.shape[0]]
            want = gguf.quants.dequantize(gguf.quants.quantize(w, kind), kind)
            assert (gguf.quants.dequantize(t.data, kind) == want).all()
        assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32


@pytest.mark.slow   # 128 + 128 tokens and two 512 MB bandwidth copies: ~40 s on a busy 2-core VM
def test_cli_runs_the_llm_suite(tmp_path):
    from typer.testing import CliRunner
    from qlower.cli import app
    result = CliRunner().invoke(app, ["bench", "--suite", "llm", "--models", "tiny-llama", "--stacks",
                                      "eager-fp32,qlower-no-such-preset", "--batch", "1", "--rounds", "1",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "llm.md").read_text()
    assert "| tiny-llama | 1 | eager-fp32 |" in text and "qlower-no-such-preset | skipped" in text


def test_ort_int4_peer_import_leaves_logging_as_it_was():
    """Importing ONNX Runtime's MatMulNBitsQuantizer configures the root logger at INFO; the bench
    puts it back, so third-party INFO records stay off the terminal for the rest of the run."""
    import subprocess
    import sys
    code = ("import logging\n"
            "from qlower.bench.llm import _matmul_nbits_quantizer\n"
            "_matmul_nbits_quantizer()\n"
            "logging.getLogger('onnxscript.rewriter').info('an INFO record')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "an INFO record" not in done.stderr + done.stdout


def test_what_a_stack_prints_or_warns_goes_to_the_log(tiny, tmp_path, monkeypatch, capfd):
    """The terminal keeps the progress lines; a library's prints and warnings while a stack is
    built or runs go to bench.log."""
    import warnings

    from qlower.bench.logcapture import LogCapture
    original = llm.build_runner

    def noisy(*args, **kwargs):
        print("LIBRARY PRINT")
        warnings.warn("LIBRARY WARNING", FutureWarning)
        return original(*args, **kwargs)
    monkeypatch.setattr(llm, "build_runner", noisy)
    capture = LogCapture(tmp_path / "bench.log").open()
    progress = []
    try:
        results, _ = llm.run_llm(["tiny-llama"], ("eager-fp32",), (1,), prompt=8, new=2, rounds=1,
                                 bandwidth_gbs=10.0, log=progress.append, capture=capture)
    finally:
        capture.close()
    assert results[0].ok and any("built in" in line for line in progress)
    terminal = "".join(capfd.readouterr())
    assert "LIBRARY" not in terminal
    log = (tmp_path / "bench.log").read_text()
    assert "LIBRARY PRINT" in log and "LIBRARY WARNING" in log


def test_a_qlower_stack_may_name_its_backend(tiny):
    """`qlower-<preset>@openvino` compiles for OpenVINO; `+int8` is an ONNX Runtime option."""
    pytest.importorskip("openvino")
    results, _ = llm.run_llm(["tiny-llama"], ("eager-fp32", "qlower-int8-weight@openvino",
                                              "qlower-int4-weight+int8@openvino"), (1,),
                             prompt=8, new=2, rounds=1, bandwidth_gbs=10.0, log=lambda m: None)
    rows = {r.stack: r for r in results}
    ov = rows["qlower-int8-weight@openvino"]
    assert ov.ok and ov.decode_tps > 0 and ov.same_tokens is not None
    assert ov.floor_ms == pytest.approx(llm.floor_ms(llm.weight_params(tiny.lm), 8, 10.0))
    bad = rows["qlower-int4-weight+int8@openvino"]
    assert not bad.ok and "ONNX Runtime option" in bad.error
