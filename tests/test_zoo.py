"""Every zoo model quantizes, lowers and runs on onnxruntime; only ops without an ONNX lowering
fall back (the LSTM), and the result tracks fp32."""
import pytest
import torch

import qlower
from qlower import zoo
from qlower.report import sqnr_db

EXPECTED_FALLBACK: dict[str, str] = {}  # model -> expected fallback reason (none today)
MIN_SQNR = {"cnn": 25, "mobilenet": 30, "transformer": 25, "transformer-blockops": 25, "vit": 18, "bert": 18,
            "decoder": 25, "lstm": 25}


@pytest.mark.parametrize("name", sorted(n for n in zoo.ZOO if not n.startswith("hf-")))  # hf-*: test_hf.py
def test_zoo_model_compiles_and_tracks_fp32(name):
    entry = zoo.get(name)
    model = entry.model()
    cm = qlower.compile(model, entry.inputs(1), quantize="int8", calibration=entry.calibration(4),
                        backend="onnxruntime")
    report = cm.report()
    lowered, total = report.lowered_fraction()
    assert lowered == total > 0
    fallbacks = [c.reason for c in report.fallbacks]
    if name in EXPECTED_FALLBACK:
        assert any(EXPECTED_FALLBACK[name] in r for r in fallbacks)
    else:
        assert fallbacks == []
    x = entry.inputs(1, seed=11)
    with torch.no_grad():
        want = model(*x)
    assert sqnr_db(want, cm(*x)) > MIN_SQNR.get(name, 20)


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino", "iree"])
@pytest.mark.parametrize("name", sorted(n for n, e in zoo.ZOO.items() if e.dynamic is not None))
def test_zoo_dynamic_dimension_runs_at_several_sizes(name, backend):
    entry = zoo.get(name)
    model = entry.model()
    cm = qlower.compile(model, entry.inputs(2), backend=backend, dynamic_shapes=entry.dynamic())
    spec = entry.dynamic()
    axis = next(iter(spec[0]))
    for size in (1, 3) if axis == 0 else (7, 31):
        x = entry.inputs(size) if axis == 0 else (torch.randn(1, size, 40), *entry.inputs(1)[1:])
        with torch.no_grad():
            want = model(*x)
        got = cm(*x)
        want0 = want[0] if isinstance(want, tuple) else want
        got0 = got[0] if isinstance(got, tuple) else got
        assert got0.shape == want0.shape and torch.allclose(got0, want0, atol=1e-4), (name, size)


def test_every_zoo_entry_makes_inputs_without_building_its_model():
    for name, entry in zoo.ZOO.items():
        first, again = entry.inputs(2, seed=3), entry.inputs(2, seed=3)
        assert all(torch.equal(a, b) for a, b in zip(first, again)), name  # seeded
        assert first and all(t.shape[0] in (1, 2) for t in first), name


@pytest.mark.parametrize("name", sorted(n for n in zoo.ZOO if not n.startswith("hf-")))
def test_float_zoo_model_runs_entirely_in_onnxruntime(name):
    """Without quantization every zoo op is a float ONNX op: one cluster, no fallback. Guards the
    capability and the emitter against drifting apart (aten::max_pool2d was once accepted but
    not emitted, which showed only as a compile-time fallback)."""
    entry = zoo.get(name)
    model = entry.model()
    cm = qlower.compile(model, entry.inputs(1), backend="onnxruntime")
    assert [c.reason for c in cm.report().fallbacks] == []
    x = entry.inputs(1, seed=11)
    with torch.no_grad():
        want = torch.utils._pytree.tree_leaves(model(*x))
    for got, ref in zip(torch.utils._pytree.tree_leaves(cm(*x)), want):
        assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4), name
