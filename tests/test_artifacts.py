"""Artifacts are safe to load (nothing in them is unpickled or run), verified part by part,
written atomically, carry backend options, and saving never touches the caller's model."""
import builtins
import copy
import io
import json

import pytest
import torch

import qlower
from qlower.errors import ArtifactError
from qlower import artifact

from conftest import calib


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Counter(torch.nn.Module):
    """A buffer written in forward: module state."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("n", torch.zeros(()))

    def forward(self, x):
        self.n.add_(1)
        return self.fc(x) + self.n


class MakesMarker:
    """Unpickling this creates a file: the proof that a loader ran code from the artifact."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return builtins.open, (self.path, "w")


def _tiny():
    torch.manual_seed(0)
    return Tiny().eval(), torch.randn(2, 8)


def _rewrite(path, changes, fix_manifest=True):
    """The archive at `path` with parts replaced (bytes) or removed (None); the manifest's hashes
    are recomputed unless fix_manifest is False (what a careless tamperer would do)."""
    from torch.export.pt2_archive import PT2ArchiveWriter
    records = artifact._records(path.read_bytes(), path)
    records.update(changes)
    records = {n: d for n, d in records.items() if d is not None}
    if fix_manifest and artifact.MANIFEST in records:
        manifest = json.loads(records[artifact.MANIFEST])
        manifest["parts"] = {n: artifact._sha256(d) for n, d in records.items()
                             if n != artifact.MANIFEST and n not in artifact._WRITER_RECORDS}
        records[artifact.MANIFEST] = json.dumps(manifest).encode()
    with PT2ArchiveWriter(str(path)) as writer:
        for name, data in records.items():
            if name not in artifact._WRITER_RECORDS and not writer.has_record(name):
                writer.write_bytes(name, data)
    return path


def _pickled(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _non_default_options(backend: str):
    if backend == "onnxruntime":
        from qlower.backends.onnxruntime import OrtOptions
        return OrtOptions(threads=1, optimization="basic", disabled_optimizers=())
    if backend == "iree":
        from qlower.backends.iree import IreeOptions
        return IreeOptions(conv_im2col=False, driver="local-task")
    if backend == "openvino":
        from qlower.backends.openvino import OvOptions
        return OvOptions(numerics="openvino")
    return None


@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "iree", "openvino"])
def test_int8_roundtrip_is_bit_exact_and_keeps_backend_options(backend, tmp_path):
    model, x = _tiny()
    opts = _non_default_options(backend)
    cm = qlower.compile(model, (x,), quantize="int8", calibration=calib((2, 8)), backend=backend,
                        backend_options=opts, nan_policy="raise")
    loaded = qlower.load(cm.save(tmp_path / "m.pt2"))
    assert torch.equal(loaded(x), cm(x))
    assert loaded.backend_options == cm.backend_options == opts
    assert loaded.nan_policy == "raise" and loaded.report().quantized
    assert not loaded.report().fallbacks


def test_torch_export_load_reads_our_artifacts(tmp_path):
    """The manifest rides in extra/: other tools still read qlower's .pt2 files."""
    model, x = _tiny()
    cm = qlower.compile(model, (x,), backend="reference")
    ep = torch.export.load(str(cm.save(tmp_path / "m.pt2")))
    assert torch.equal(ep.module()(x), cm(x))


def _plain_pt2(tmp_path, name="plain.pt2"):
    model, x = _tiny()
    path = tmp_path / name
    torch.export.save(torch.export.export(model, (x,)), str(path))
    return path, model, x


@pytest.mark.parametrize("source", ["torch.export.save", "qlower save"])
def test_pickled_weight_is_refused_before_any_code_runs(tmp_path, source):
    path = _plain_pt2(tmp_path)[0] if source == "torch.export.save" else _saved(tmp_path)[0]
    marker = tmp_path / "pwned"
    config = json.loads(artifact._records(path.read_bytes(), path)["data/weights/model_weights_config.json"])
    name = next(iter(config["config"]))
    entry = config["config"][name]
    entry["use_pickle"] = True
    _rewrite(path, {"data/weights/model_weights_config.json": json.dumps(config).encode(),
                    f"data/weights/{entry['path_name']}": _pickled(MakesMarker(marker))})
    with pytest.raises(Exception):   # the crafted file is live: torch's loader runs it
        torch.export.load(str(path))
    assert marker.exists()
    marker.unlink()
    for load in (qlower.load, qlower.load_pt2):
        with pytest.raises(ArtifactError, match="pickle") as info:
            load(path)
        assert name in str(info.value) and info.value.hint
    assert not marker.exists()


def test_pickled_sample_inputs_are_never_read(tmp_path):
    """torch.load(weights_only=True) fails on the object and torch falls back to a full unpickle;
    qlower never reads the sample inputs, so a plain program with them loads safely."""
    path, model, x = _plain_pt2(tmp_path)
    marker = tmp_path / "pwned"
    _rewrite(path, {"data/sample_inputs/model.pt": _pickled(MakesMarker(marker))})
    try:
        torch.export.load(str(path))
    except Exception:
        pass
    assert marker.exists()
    marker.unlink()
    ep = qlower.load_pt2(path)
    assert not marker.exists()
    assert torch.equal(ep.module()(x), model(x))


def test_compiled_code_and_unknown_parts_are_refused(tmp_path):
    path, _, _ = _plain_pt2(tmp_path)
    _rewrite(path, {"data/aotinductor/model/model.so": b"\x7fELF"})
    with pytest.raises(ArtifactError, match="data/aotinductor/model/model.so"):
        qlower.load_pt2(path)


def test_only_operators_are_callable_targets():
    import operator
    import os
    assert artifact._safe_callable(torch.ops.aten.add.Tensor) and artifact._safe_callable(operator.getitem)
    assert not artifact._safe_callable(os.system) and not artifact._safe_callable(torch.load)
    assert not artifact._safe_callable(eval) and not artifact._safe_callable([])


def test_node_target_outside_the_operators_is_refused(tmp_path):
    """torch resolves a target by getattr on the torch module (torch.os.system resolves); torch's
    verifier or qlower's target check refuses it, always as an ArtifactError."""
    path, _, _ = _plain_pt2(tmp_path)
    program = json.loads(artifact._records(path.read_bytes(), path)["models/model.json"])
    program["graph_module"]["graph"]["nodes"][0]["target"] = "torch.os.system"
    _rewrite(path, {"models/model.json": json.dumps(program).encode()})
    with pytest.raises(ArtifactError):
        qlower.load_pt2(path)


@pytest.mark.parametrize("expr,safe", [
    ("s0*2 + FloorDiv(s77, 4)", True), ("Symbol('s77', positive=True, integer=True)", True),
    ("Mul(Integer(2), Symbol('s1', integer=True))", True), ("Symbol('__import__')", False),
    ("Max(1, s3) - 1.5e3", True), ("Eq(Mod(u0, 2), 0)", True),
    ("__import__('os').system('x')", False), ("s0.__class__", False), ("eval(s0)", False),
    ("(lambda: 0)()", False), ("s0[0]", False)])
def test_symbolic_expressions_must_be_arithmetic(expr, safe):
    """torch's deserializer sympify()s (evaluates) expr_str fields."""
    assert artifact._safe_sym_expr(expr) is safe


def test_tampered_expression_is_refused(tmp_path):
    path, _, _ = _plain_pt2(tmp_path)
    raw = artifact._records(path.read_bytes(), path)["models/model.json"]
    program = json.loads(raw)
    program["graph_module"]["graph"]["nodes"][0]["metadata"]["x"] = {"expr_str": "__import__('os')"}
    _rewrite(path, {"models/model.json": json.dumps(program).encode()})
    with pytest.raises(ArtifactError, match="not arithmetic"):
        qlower.load_pt2(path)


def _saved(tmp_path):
    model, x = _tiny()
    cm = qlower.compile(model, (x,), quantize="int8", calibration=calib((2, 8)), backend="reference")
    return cm.save(tmp_path / "m.pt2"), cm, x


def test_flipped_byte_in_a_weight_names_the_part(tmp_path):
    path, _, _ = _saved(tmp_path)
    records = artifact._records(path.read_bytes(), path)
    weight = max((n for n in records if n.startswith("data/weights/weight_")), key=lambda n: len(records[n]))
    data = path.read_bytes()
    at = data.index(records[weight]) + len(records[weight]) // 2
    path.write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:])
    with pytest.raises(ArtifactError, match=weight) as info:
        qlower.load(path)
    assert "sha256" in str(info.value)


def test_artifact_from_a_newer_qlower_is_a_typed_error_with_a_hint(tmp_path):
    path, _, _ = _saved(tmp_path)
    manifest = json.loads(artifact._records(path.read_bytes(), path)[artifact.MANIFEST])
    manifest.update(format=artifact.ARTIFACT_FORMAT + 1, qlower_version="9.0.0")
    _rewrite(path, {artifact.MANIFEST: json.dumps(manifest).encode()}, fix_manifest=False)
    with pytest.raises(ArtifactError, match="format 3") as info:
        qlower.load(path)
    assert "upgrade qlower" in info.value.hint


def test_plain_torch_export_file_is_a_typed_error_for_load_and_loads_with_load_pt2(tmp_path):
    path, model, x = _plain_pt2(tmp_path)
    with pytest.raises(ArtifactError, match="not a qlower artifact") as info:
        qlower.load(path)
    assert "load_pt2" in info.value.hint
    assert torch.equal(qlower.load_pt2(path).module()(x), model(x))


@pytest.mark.parametrize("fix_manifest", [True, False])
def test_tampered_metadata_is_a_typed_error(tmp_path, fix_manifest):
    path, _, _ = _saved(tmp_path)
    meta = json.loads(artifact._records(path.read_bytes(), path)["extra/qlower.json"])
    meta["input_specs"][0]["dtype"] = "load"     # getattr(torch, "load") is a function, not a dtype
    _rewrite(path, {"extra/qlower.json": json.dumps(meta).encode()}, fix_manifest=fix_manifest)
    match = "metadata is malformed" if fix_manifest else "extra/qlower.json"
    with pytest.raises(ArtifactError, match=match) as info:
        qlower.load(path)
    assert info.value.hint


def test_truncated_and_missing_files_are_typed(tmp_path):
    path, _, _ = _saved(tmp_path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ArtifactError):
        qlower.load(path)
    with pytest.raises(ArtifactError, match="no such file"):
        qlower.load(tmp_path / "missing.pt2")


def test_failed_save_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    path, cm, x = _saved(tmp_path)
    before = path.read_bytes()

    def crash(tmp, parts, manifest):
        tmp.write_bytes(b"half a file")
        raise OSError("disk full")
    monkeypatch.setattr(artifact, "_write_archive", crash)
    with pytest.raises(ArtifactError, match="disk full") as info:
        cm.save(path)
    assert "previous file is unchanged" in info.value.hint
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "qlower-cache") == ["m.pt2"]


def test_save_into_a_missing_directory_is_typed(tmp_path):
    model, x = _tiny()
    cm = qlower.compile(model, (x,), backend="reference")
    with pytest.raises(ArtifactError, match="cannot write") as info:
        cm.save(tmp_path / "no" / "such" / "m.pt2")
    assert "directory exists" in info.value.hint


@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "iree", "openvino"])
def test_save_never_changes_the_callers_model(backend, tmp_path):
    torch.manual_seed(0)
    model = Counter().eval()
    x = torch.randn(2, 4)
    cm = qlower.compile(model, (x,), backend=backend)
    for _ in range(3):
        cm(x)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loaded = qlower.load(cm.save(tmp_path / "c.pt2"))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert cm.stateful and loaded.stateful   # the loaded model still serializes its calls
    # the artifact carries the running state (3 calls), and the loaded model continues from it
    eager = copy.deepcopy(model)
    eager.n.fill_(3)
    assert torch.equal(loaded(x), eager(x))


def test_artifact_of_an_older_qlower_without_manifest_asks_to_resave(tmp_path):
    path, _, _ = _saved(tmp_path)
    _rewrite(path, {artifact.MANIFEST: None})
    with pytest.raises(ArtifactError, match="older qlower") as info:
        qlower.load(path)
    assert "re-save" in info.value.hint


def test_attribute_name_that_would_be_code_is_refused(tmp_path):
    """FX writes parameter names into generated source as getattr(self, "<name>")."""
    path, _, _ = _plain_pt2(tmp_path)
    records = artifact._records(path.read_bytes(), path)
    evil = 'fc") or __import__("os").system("true") or getattr(self, "x'
    changes = {}
    for name in ("models/model.json", "data/weights/model_weights_config.json"):
        changes[name] = records[name].replace(b'"fc.weight"', json.dumps(evil + ".weight").encode())
    assert changes["models/model.json"] != records["models/model.json"]
    _rewrite(path, changes)
    with pytest.raises(ArtifactError, match="not a dotted name"):
        qlower.load_pt2(path)


class _Marked(torch.Tensor):
    """A tensor subclass: torch.export.save pickles it."""


class WithSubclassBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.ones(3).as_subclass(_Marked))

    def forward(self, x):
        return x + self.b


def test_tensor_subclass_weights_are_refused_on_save_and_on_load(tmp_path):
    ep = torch.export.export(WithSubclassBuffer(), (torch.randn(3),))
    with pytest.raises(ArtifactError, match="'b' is stored as a pickle"):
        qlower.save_pt2(ep, tmp_path / "ours.pt2")
    assert not (tmp_path / "ours.pt2").exists()
    torch.export.save(ep, str(tmp_path / "theirs.pt2"))
    with pytest.raises(ArtifactError, match="'b' is stored as a pickle") as info:
        qlower.load_pt2(tmp_path / "theirs.pt2")
    assert "tensor subclasses" in info.value.hint


def test_save_to_a_246_character_file_name(tmp_path):
    model, x = _tiny()
    cm = qlower.compile(model, (x,), backend="reference")
    path = tmp_path / ("m" * 242 + ".pt2")
    assert len(path.name) == 246
    cm.save(path)
    assert torch.equal(qlower.load(path)(x), cm(x))
    assert [p.name for p in tmp_path.iterdir()] == [path.name]   # no temporary left behind
