import pytest
import torch

import qlower
from qlower.errors import BackendError, InputError

from conftest import calib

ops = torch.ops.qlower


class TwoOutputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 4)
        self.b = torch.nn.Linear(8, 3)

    def forward(self, x, y):
        return {"a": self.a(x), "b": (self.b(y), x.sum())}


def compiled(model, shape, **kw):
    return qlower.compile(model, (torch.randn(*shape),), quantize="int8", calibration=calib(shape),
                          backend="reference", **kw)


def test_compile_reference_lowers_everything_and_reports(small_net):
    cm = compiled(small_net, (1, 3, 8, 8))
    report = cm.report()
    assert report.backend == "reference" and report.quantized
    assert report.lowered_fraction() == (3, 3)
    assert len(report.clusters) == 1 and not report.fallbacks
    assert "qlower::conv2d" in str(report)
    y = cm(torch.randn(1, 3, 8, 8))
    assert y.shape == (1, 5)


def test_output_structure_is_preserved():
    torch.manual_seed(0)
    m = TwoOutputs().eval()
    x, y = torch.randn(2, 8), torch.randn(2, 8)
    cm = qlower.compile(m, (x, y), quantize="int8", calibration=[(x, y)], backend="reference")
    out = cm(x, y)
    assert set(out) == {"a", "b"} and isinstance(out["b"], tuple) and out["b"][0].shape == (2, 3)
    assert torch.equal(out["b"][1], x.sum())


def test_float_compile_without_quantization_is_exact(small_net):
    x = torch.randn(1, 3, 8, 8)
    cm = qlower.compile(small_net, (x,), backend="reference")
    assert not cm.report().quantized
    assert torch.equal(cm(x), small_net(x))


def test_save_load_roundtrip_identical(small_net, tmp_path):
    cm = compiled(small_net, (1, 3, 8, 8))
    x = torch.randn(1, 3, 8, 8)
    path = cm.save(tmp_path / "m.pt2")
    cm2 = qlower.load(path)
    assert torch.equal(cm2(x), cm(x))
    assert cm2.report().rewrites == cm.report().rewrites
    with pytest.raises(InputError):
        cm2(torch.randn(1, 3, 9, 8))


def test_dynamic_batch_runs_at_several_sizes(small_net, tmp_path):
    batch = torch.export.Dim("batch", min=1, max=16)
    cm = compiled(small_net, (2, 3, 8, 8), dynamic_shapes={"x": {0: batch}})
    outs = {b: cm(torch.randn(b, 3, 8, 8)).shape for b in (1, 3, 8)}
    assert outs == {1: (1, 5), 3: (3, 5), 8: (8, 5)}
    cm2 = qlower.load(cm.save(tmp_path / "dyn.pt2"))
    x = torch.randn(3, 3, 8, 8)
    assert torch.equal(cm2(x), cm(x))


def test_dynamic_batch_without_a_maximum(small_net):
    """`Dim(min=2)` with no max: sympy's oo as the upper bound made the input check raise a raw
    AttributeError at compile (`int(oo)`); unbounded now, checked only from below."""
    cm = compiled(small_net, (2, 3, 8, 8), dynamic_shapes={"x": {0: torch.export.Dim("batch", min=2)}})
    assert cm(torch.randn(40, 3, 8, 8)).shape == (40, 5)
    with pytest.raises(InputError, match="dim 0"):
        cm(torch.randn(1, 3, 8, 8))


@pytest.mark.parametrize("args,match", [
    ((), "expected 1 input"),
    ((torch.randn(1, 3, 8, 8), torch.randn(1)), "expected 1 input"),
    ((torch.randn(1, 3, 8, 8).double(),), "dtype float32"),
    ((torch.randn(3, 8, 8),), "rank 4"),
    ((torch.randn(2, 3, 8, 8),), "dim 0 must be 1"),
    (("x",), "expected a tensor"),
])
def test_bad_call_inputs_are_typed(small_net, args, match):
    cm = compiled(small_net, (1, 3, 8, 8))
    with pytest.raises(InputError, match=match) as info:
        cm(*args)
    assert info.value.hint


def test_bad_compile_arguments_are_typed(small_net):
    x = (torch.randn(1, 3, 8, 8),)
    with pytest.raises(BackendError, match="unknown backend"):
        qlower.compile(small_net, x, backend="tpu")
    with pytest.raises(qlower.QlowerError, match="profile"):
        qlower.compile(small_net, x, profile="double")
    with pytest.raises(qlower.CaptureError):
        qlower.compile("not a model", x)


def test_fixed_profile_compiles_and_stays_accurate(small_net):
    x = torch.randn(1, 3, 8, 8)
    a = compiled(small_net, (1, 3, 8, 8))
    b = compiled(small_net, (1, 3, 8, 8), profile="fixed")
    assert b.report().profile == "fixed"
    assert qlower.report.sqnr_db(a(x), b(x)) > 30


def test_a_pass_list_with_a_non_pass_is_a_typed_error(small_net):
    from qlower.errors import PassError
    from qlower.passes import default_pipeline
    with pytest.raises(PassError, match="not a qlower pass"):
        qlower.compile(small_net, (torch.randn(1, 3, 16, 16),), passes=[*default_pipeline(), "lower_qdq"])


def _alive_graph_modules() -> int:
    import gc
    gc.collect()
    return sum(isinstance(o, torch.fx.GraphModule) for o in gc.get_objects())


def _footprint_after_each(build, times=3) -> list[tuple[int, int]]:
    """(generated sources torch.fx holds, GraphModules alive) after each of `times` builds whose
    results are discarded at once."""
    from torch.fx.graph_module import _loader
    counts = []
    for _ in range(times):
        build()
        counts.append((_alive_graph_modules(), len(_loader.eval_cache)))
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("quantize", [None, "int8"])
def test_compile_keeps_nothing_of_a_discarded_model(small_net, quantize):
    """torch.fx keeps every GraphModule's generated source (and torchao an lru_cache keyed by the
    quantized module): a process compiling models one after another grew without bound (a fuzz
    run: 4.8 GB after 10,000 examples). A compile keeps only its result's own graphs' source."""
    from torch.fx.graph_module import _loader
    x = torch.randn(2, 3, 8, 8)
    calibration = calib(x.shape) if quantize else None

    def build():
        return qlower.compile(small_net, (x,), quantize=quantize, calibration=calibration, backend="reference")
    first, *rest = _footprint_after_each(build)
    assert all(counts == first for counts in rest)
    before = set(_loader.eval_cache)
    cm = build()
    own = {type(m).forward.__code__.co_filename for m in cm.graph_module.modules()
           if isinstance(m, torch.fx.GraphModule)}
    assert own and set(_loader.eval_cache) - before == own


@pytest.mark.slow
def test_quantize_keeps_nothing_of_a_discarded_program(small_net):
    x = torch.randn(2, 3, 8, 8)
    first, *rest = _footprint_after_each(lambda: qlower.quantize(small_net, (x,), calib(x.shape)))
    assert all(counts == first for counts in rest)


def test_fake_tensor_dispatch_cache_is_kept_bounded(small_net, monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode
    import qlower.fx
    x = torch.randn(2, 3, 8, 8)
    qlower.compile(small_net, (x,), backend="reference")
    assert len(FakeTensorMode.cache) > 0   # torch fills it while capturing
    monkeypatch.setattr(qlower.fx, "FAKE_DISPATCH_CACHE_LIMIT", 0)
    qlower.compile(small_net, (x,), backend="reference")
    assert len(FakeTensorMode.cache) == 0


class _Dropped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.drop = torch.nn.Dropout(0.5)
        self.head = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))

    def forward(self, x):
        return self.head(self.drop(self.fc(x)))


def test_compile_keeps_the_callers_train_and_eval_mode():
    model = _Dropped().train()
    model.head.eval()   # a mixed state must come back exactly
    before = {name: m.training for name, m in model.named_modules()}
    cm = qlower.compile(model, (torch.randn(2, 8),), backend="reference")
    assert {name: m.training for name, m in model.named_modules()} == before
    x = torch.randn(2, 8)
    assert torch.equal(cm(x), model.eval()(x))   # compiled in eval mode: no dropout
    model.train()
    with pytest.raises(qlower.QlowerError):
        qlower.compile(model, (torch.randn(2, 8),), backend="reference", profile="no-such-profile")
    assert all(m.training for m in model.modules())
