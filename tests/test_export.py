"""`qlower.export(..., format="onnx")`: portable standard-op ONNX by default, the contrib-op form
on request, from any compile (and from a loaded artifact), the model's own input and output
names, symbolic dims, and an error naming the nodes outside the cluster. Every exported file
runs in plain ONNX Runtime (and OpenVINO where installed) and is compared with qlower's output."""
import onnx
import pytest
import torch

import qlower
from qlower.backends.export_checks import declared_tolerance, output_quanta_of, read as read_metadata
from qlower.onnx.standard import non_standard_domains

from conftest import HAS_IREE, HAS_OPENVINO, SmallNet, calib, opaque

BATCH = torch.export.Dim("batch", min=1, max=16)
SIZES = (1, 3, 7)
SQNR_NO_BOUND = 30.0   # dB against qlower's output, for a consumer that declares no bound


def ort_run(path, feed: dict) -> list:
    """Plain ONNX Runtime, with the optimizers the file's metadata names turned off."""
    import onnxruntime as ort
    disabled = read_metadata(onnx.load(str(path)))["qlower.onnxruntime.disabled_optimizers"].split(",")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
    return [torch.from_numpy(y) for y in session.run(None, {k: v.numpy() for k, v in feed.items()})]


def ov_run(path, feed: dict) -> list:
    import openvino as ov
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    result = compiled({k: v.numpy() for k, v in feed.items()})
    return [torch.from_numpy(result[port].copy()) for port in compiled.outputs]


def consumers() -> list:
    return [ort_run] + ([ov_run] if HAS_OPENVINO else [])


def within_declared(model: onnx.ModelProto, consumer, got: torch.Tensor, want: torch.Tensor) -> bool:
    """|got - want| within the bound the file declares for `consumer` (its metadata), counted in
    output quanta where the file declares them. A consumer with no declared bound (OpenVINO:
    its quantize rounds near-ties either way) must stay above SQNR_NO_BOUND dB of qlower's
    output instead."""
    value, unit, bound = declared_tolerance(model, "onnxruntime" if consumer is ort_run else "openvino")
    if not bound:
        return sqnr(want, got) >= SQNR_NO_BOUND
    diff = (got.double() - want.double()).abs()
    if unit == "quanta":
        (quantum,) = output_quanta_of(model)
        return bool((diff / quantum).round().max() <= value)
    return bool(diff.max() <= value)


def sqnr(want: torch.Tensor, got: torch.Tensor) -> float:
    noise = (got.double() - want.double()).pow(2).sum()
    return float("inf") if noise == 0 else float(10 * torch.log10(want.double().pow(2).sum() / noise))


def measured(model: onnx.ModelProto, consumer) -> float:
    """The deviation measured at export (its metadata)."""
    name = "onnxruntime" if consumer is ort_run else "openvino"
    return float(read_metadata(model)[f"qlower.max_abs_diff.{name}"])


@pytest.fixture(scope="module")
def small_int8():
    """SmallNet int8, batch dynamic, compiled for onnxruntime."""
    torch.manual_seed(0)
    x = (torch.randn(2, 3, 16, 16),)
    return qlower.compile(SmallNet().eval(), x, quantize="int8", calibration=calib((2, 3, 16, 16)),
                          dynamic_shapes=({0: BATCH},), backend="onnxruntime")


def test_default_export_is_standard_onnx_and_bit_exact_at_every_size(small_int8, tmp_path):
    """The default export: standard ai.onnx operators only, full checker, the numerics and the
    measured deviation in its metadata; plain ONNX Runtime and OpenVINO run it at three batch
    sizes (one file, batch symbolic and named) within the declared deviation, here 0: bit for bit."""
    path = qlower.export(small_int8, tmp_path / "m.onnx", format="onnx")
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert non_standard_domains(model) == set()
    assert {o.domain for o in model.opset_import} <= {"", "ai.onnx"} and not model.functions
    meta = read_metadata(model)
    assert meta["qlower.onnx_ops"] == "standard" and "canonical integer program" in meta["qlower.numerics"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    import onnxruntime as ort   # an integer program: a default session computes it bit for bit too
    x = torch.randn(2, 3, 16, 16)
    (got,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})
    assert torch.equal(torch.from_numpy(got), small_int8(x))
    for run in consumers():
        assert measured(model, run) == 0.0, meta
        for b in SIZES:
            x = torch.randn(b, 3, 16, 16)
            (got,) = run(path, {"x": x})
            assert within_declared(model, run, got, small_int8(x)) and torch.equal(got, small_int8(x)), \
                (run.__name__, b)


def test_onnxruntime_ops_export_is_bit_exact_on_onnxruntime(small_int8, tmp_path):
    """onnx_ops="onnxruntime": the backend's own model (contrib kernels), checker-clean, bit-exact."""
    path = qlower.export(small_int8, tmp_path / "m.onnx", format="onnx", onnx_ops="onnxruntime")
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert non_standard_domains(model) == {"com.microsoft"}
    assert read_metadata(model)["qlower.onnx_ops"] == "onnxruntime"
    for b in SIZES:
        x = torch.randn(b, 3, 16, 16)
        (got,) = ort_run(path, {"x": x})
        assert torch.equal(got, small_int8(x))
    with pytest.raises(qlower.QlowerError, match="onnx_ops"):
        qlower.export(small_int8, tmp_path / "x.onnx", format="onnx", onnx_ops="tensorrt")
    with pytest.raises(qlower.QlowerError, match="onnx_ops"):
        qlower.export(small_int8, tmp_path / "x.pt2", format="pt2", onnx_ops="onnxruntime")


def test_qdq_export_is_standard_qdq_around_float_ops(small_int8, tmp_path):
    """onnx_ops="qdq": QuantizeLinear / DequantizeLinear around float Conv / Gemm, standard
    operators only, checker-clean; ONNX Runtime (a default session: its own QDQ fusions) and
    OpenVINO run it at three sizes, with no declared bound: within SQNR_NO_BOUND dB of qlower.
    A loaded model, which keeps only its lowered program, is a typed error."""
    import onnxruntime as ort
    path = qlower.export(small_int8, tmp_path / "q.onnx", format="onnx", onnx_ops="qdq")
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    ops = {n.op_type for n in model.graph.node}
    assert non_standard_domains(model) == set() and {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    assert not ops & {"ConvInteger", "MatMulInteger"}, ops
    assert read_metadata(model)["qlower.onnx_ops"] == "qdq"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for b in SIZES:
        x = torch.randn(b, 3, 16, 16)
        want = small_int8(x)
        assert within_declared(model, ort_run, torch.from_numpy(session.run(None, {"x": x.numpy()})[0]), want)
        for run in consumers():
            (got,) = run(path, {"x": x})
            assert within_declared(model, run, got, want), (run.__name__, b)
    loaded = qlower.load(small_int8.save(tmp_path / "m.pt2"))
    with pytest.raises(qlower.BackendError, match="qdq"):
        qlower.export(loaded, tmp_path / "l.onnx", format="onnx", onnx_ops="qdq")


def test_export_from_a_reference_compile_and_from_a_loaded_artifact(small_int8, tmp_path):
    """Export lowers the model's quantized program, whatever it was compiled for: the reference
    backend (no engine at all) and a model read back with qlower.load give the same file's
    results, equal to qlower's."""
    program = qlower.quantize(SmallNet().eval(), (torch.randn(2, 3, 16, 16),), calib((2, 3, 16, 16)),
                              dynamic_shapes=({0: BATCH},))
    ref = qlower.compile(program, (torch.randn(2, 3, 16, 16),), backend="reference", dynamic_shapes=({0: BATCH},))
    loaded = qlower.load(small_int8.save(tmp_path / "m.pt2"))
    for cm, name in ((ref, "ref.onnx"), (loaded, "loaded.onnx")):
        path = qlower.export(cm, tmp_path / name, format="onnx")
        x = torch.randn(3, 3, 16, 16)
        (got,) = ort_run(path, {"x": x})
        assert torch.equal(got, cm(x)), name


class Named(torch.nn.Module):
    """Two inputs, read by the cluster in the other order, and a dict output."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, image, bias):
        b = torch.relu(bias)
        return {"logits": self.fc(image) + b, "features": image * 2}


class Clash(torch.nn.Module):
    """An output key equal to an input's name, and one value returned twice."""

    def forward(self, x):
        y = x * 2
        return {"x": y, "dup": y}


class Pair(torch.nn.Module):
    def forward(self, x):
        return x + 1, x * 3


@pytest.mark.parametrize("onnx_ops", ["standard", "onnxruntime"])
def test_graph_and_report_carry_the_models_names(tmp_path, onnx_ops):
    """Inputs named as forward's arguments (in its order, whatever order the cluster reads them
    in), outputs as the output structure's keys (a dict; one named like an input suffixed, one
    value returned twice under both names) or output_i (a tuple); cm.report() shows the same
    names."""
    x = (torch.randn(2, 8), torch.randn(2, 4))
    cm = qlower.compile(Named().eval(), x, backend="onnxruntime")
    assert cm.report().inputs == ["image", "bias"] and cm.report().outputs == ["logits", "features"]
    assert "inputs: image, bias   outputs: logits, features" in str(cm.report())
    model = onnx.load(qlower.export(cm, tmp_path / "n.onnx", format="onnx", onnx_ops=onnx_ops))
    assert [i.name for i in model.graph.input] == ["image", "bias"]
    assert [o.name for o in model.graph.output] == ["logits", "features"]
    got = ort_run(tmp_path / "n.onnx", {"image": x[0], "bias": x[1]})
    want = cm(*x)
    assert torch.equal(got[0], want["logits"]) and torch.equal(got[1], want["features"])
    clash = qlower.compile(Clash().eval(), (torch.randn(3),), backend="reference")
    assert clash.report().outputs == ["x_1", "dup"]
    model = onnx.load(qlower.export(clash, tmp_path / "c.onnx", format="onnx", onnx_ops=onnx_ops))
    assert [o.name for o in model.graph.output] == ["x_1", "dup"]
    x3 = torch.randn(3)
    assert all(torch.equal(g, 2 * x3) for g in ort_run(tmp_path / "c.onnx", {"x": x3}))
    pair = qlower.compile(Pair().eval(), (torch.randn(3),), backend="reference")
    assert pair.report().outputs == ["output_0", "output_1"]
    model = onnx.load(qlower.export(pair, tmp_path / "p.onnx", format="onnx", onnx_ops=onnx_ops))
    assert [o.name for o in model.graph.output] == ["output_0", "output_1"]


class Opaque(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.a(opaque(x))   # a custom op no ONNX translation knows


def test_the_error_names_the_nodes_outside_the_cluster(tmp_path):
    cm = qlower.compile(Opaque().eval(), (torch.randn(2, 16),), backend="reference")
    with pytest.raises(qlower.BackendError, match=r"outside its onnxruntime cluster: opaque\w*: ") as info:
        qlower.export(cm, tmp_path / "o.onnx", format="onnx")
    assert "qlower schema" not in str(info.value) and "pt2" in info.value.hint
    assert not (tmp_path / "o.onnx").exists()


class Encoder(torch.nn.Module):
    """A small attention block with a token-id embedding: batch and sequence dynamic."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 32)
        self.attn = torch.nn.MultiheadAttention(32, 4, batch_first=True)
        self.norm = torch.nn.LayerNorm(32)
        self.fc = torch.nn.Linear(32, 32)

    def forward(self, input_ids, mask):
        h = self.embed(input_ids) * mask.unsqueeze(-1)
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.fc(self.norm(h + a))


@pytest.mark.slow
def test_dynamic_batch_and_sequence_export_runs_at_three_sizes(tmp_path):
    """One file, batch and sequence symbolic (named as the Dims), run at three sizes the compile
    never saw in ONNX Runtime and OpenVINO within the deviation its metadata declares."""
    torch.manual_seed(0)
    seq = torch.export.Dim("seq", min=2, max=32)

    def tokens(b, s, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, 50, (b, s), generator=g), (torch.rand(b, s, generator=g) > 0.2).float()
    dyn = ({0: BATCH, 1: seq}, {0: BATCH, 1: seq})
    cm = qlower.compile(Encoder().eval(), tokens(2, 8, 0), quantize="int8",
                        calibration=[tokens(2, 8, i) for i in range(1, 4)], dynamic_shapes=dyn, backend="onnxruntime")
    path = qlower.export(cm, tmp_path / "e.onnx", format="onnx")
    model = onnx.load(path)
    assert [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim] == ["batch", "seq"]
    for run in consumers():
        for b, s in ((1, 3), (4, 17), (16, 32)):
            ids, mask = tokens(b, s, 10 + b)
            (got,) = run(path, {"input_ids": ids, "mask": mask})
            assert got.shape == (b, s, 32)
            assert within_declared(model, run, got, cm(ids, mask)), (run.__name__, b, s)


def test_cli_export_onnx_ops(tmp_path, small_int8):
    """`qlower export A.pt2 OUT.onnx [--onnx-ops onnxruntime]` on a saved artifact (dynamic
    dims kept)."""
    from typer.testing import CliRunner
    from qlower.cli import app
    artifact = small_int8.save(tmp_path / "m.pt2")
    for ops, domains in (("standard", set()), ("onnxruntime", {"com.microsoft"})):
        out = tmp_path / f"{ops}.onnx"
        result = CliRunner().invoke(app, ["export", str(artifact), str(out), "--onnx-ops", ops])
        assert result.exit_code == 0, result.output
        model = onnx.load(out)
        assert non_standard_domains(model) == domains
        assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param


# ---------------------------------------------------------------------------- slow: zoo, engines
@pytest.mark.slow
@pytest.mark.parametrize("name", ["cnn", "mobilenet", "transformer"])
def test_zoo_export_runs_in_onnxruntime_and_openvino_within_the_declared_deviation(name, tmp_path):
    """The zoo models int8 (batch dynamic): the standard file at three batch sizes in plain ONNX
    Runtime and OpenVINO within the deviation its metadata declares (the CNNs bit for bit on ONNX
    Runtime, within one output quantum on OpenVINO), and the onnxruntime-ops file bit-exact on
    ONNX Runtime."""
    from qlower.zoo import ZOO
    entry = ZOO[name]
    cm = qlower.compile(entry.model(), entry.inputs(2), quantize="int8", calibration=entry.calibration(4, 2),
                        dynamic_shapes=entry.dynamic(), backend="onnxruntime")
    path = qlower.export(cm, tmp_path / "m.onnx", format="onnx")
    model = onnx.load(path)
    assert non_standard_domains(model) == set()
    contrib = qlower.export(cm, tmp_path / "c.onnx", format="onnx", onnx_ops="onnxruntime")
    for b in SIZES:
        (x,) = entry.inputs(b, seed=20 + b)
        want = cm(x)
        for run in consumers():
            (got,) = run(path, {"x": x})
            assert within_declared(model, run, got, want), (run.__name__, b)
            if name != "transformer" and run is ort_run:   # the CNNs: bit for bit on ONNX Runtime
                assert torch.equal(got, want), b
        assert torch.equal(ort_run(contrib, {"x": x})[0], want)


@pytest.mark.slow
def test_transformers_bert_dynamic_export_with_its_output_names(tmp_path):
    """transformers' BertModel int8 with batch and sequence dynamic: one file whose inputs are
    `input_ids`, `attention_mask` and outputs the ModelOutput's fields, run at three sizes in
    ONNX Runtime and OpenVINO within the declared deviation."""
    transformers = pytest.importorskip("transformers")
    from qlower.zoo import hf
    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        hidden_size=64, intermediate_size=128, max_position_embeddings=64, vocab_size=1000, num_hidden_layers=2,
        num_attention_heads=4)).eval()
    seq = torch.export.Dim("seq", min=2, max=64)
    dyn = {"input_ids": {0: BATCH, 1: seq}, "attention_mask": {0: BATCH, 1: seq}}
    cm = qlower.compile(bert, hf.token_batch(0), quantize="transformer",
                        calibration=[hf.token_batch(i) for i in range(1, 4)], dynamic_shapes=dyn,
                        backend="onnxruntime")
    path = qlower.export(cm, tmp_path / "bert.onnx", format="onnx")
    model = onnx.load(path)
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in model.graph.output] == ["last_hidden_state", "pooler_output"]
    assert cm.report().outputs == ["last_hidden_state", "pooler_output"]
    for run in consumers():
        for b, s in ((1, 9), (3, 17), (16, 64)):
            ids, mask = hf.token_batch(7, b, s)
            want = cm(ids, mask)
            got = run(path, {"input_ids": ids, "attention_mask": mask})
            for g, w in zip(got, (want.last_hidden_state, want.pooler_output)):
                assert within_declared(model, run, g, w), (run.__name__, b, s)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_IREE, reason="iree is not installed")
@pytest.mark.parametrize("backend,candidates", [("iree", None), ("auto", None), ("auto", ("iree",))],
                         ids=["iree", "auto", "auto-chose-iree"])
def test_export_after_an_iree_or_auto_compile(backend, candidates, tmp_path):
    """Whatever engine the model was compiled for (IREE, what auto chose, auto choosing IREE),
    the ONNX export is lowered from its quantized program and equals its output on ONNX
    Runtime; and a model compiled for onnxruntime exports an IREE module."""
    from qlower.zoo import ZOO
    entry = ZOO["cnn"]
    cm = qlower.compile(entry.model(), entry.inputs(1), quantize="int8", calibration=entry.calibration(4),
                        backend=backend, auto_candidates=candidates)
    if candidates:
        assert cm.backend == "iree"
    path = qlower.export(cm, tmp_path / "m.onnx", format="onnx")
    (x,) = entry.inputs(1, seed=5)
    assert torch.equal(ort_run(path, {"x": x})[0], cm(x))
    assert read_metadata(onnx.load(path))["qlower.compiled_for"] == cm.backend
    if backend == "iree":
        ort_cm = qlower.compile(entry.model(), entry.inputs(1), quantize="int8", calibration=entry.calibration(4),
                                backend="onnxruntime")
        vmfb = qlower.export(ort_cm, tmp_path / "m.vmfb", format="vmfb")
        assert vmfb.stat().st_size > 0
