"""The whole-call path on onnxruntime (Executable.validating_run): where one cluster covers the
model and its session checks every input the way the input specs do (dtype, rank, every dim
static), a call goes straight to the session; whatever the session refuses takes the general
path, which names the problem in a typed error, and the cluster stays on the engine."""
import math

import pytest
import torch

import qlower
from qlower.backends.onnxruntime import OrtCluster
from qlower.errors import InputError
from qlower.zoo import get


@pytest.fixture(scope="module")
def lstm():
    """The zoo LSTM: 3 inputs, 3 outputs that the cluster makes in another order than the
    model returns them."""
    entry = get("lstm")
    model, x = entry.model(), entry.inputs()
    cm = qlower.compile(model, x, backend="onnxruntime")
    cluster = next(m for m in cm._executable.module.children() if isinstance(m, OrtCluster))
    return model, x, cm, cluster


def _assert_still_on_the_engine(cm) -> None:
    assert [c.status for c in cm.report().clusters] == ["compiled"] and not cm.report().fallbacks


def test_whole_call_answers_as_the_general_path_in_the_models_order(lstm):
    model, x, cm, cluster = lstm
    assert cm._validating_run is not None
    assert cluster.output_names[:cluster.n_outputs] != cluster._validated_outputs[:cluster.n_outputs]   # reordered
    got, general = cm(*x), cm._executable.run(*x)
    assert len(got) == len(general) == 3
    assert all(torch.equal(g, w) for g, w in zip(got, general))
    want = model(*x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_one_sum_output_checks_every_float_input(lstm):
    _, x, cm, cluster = lstm
    assert cluster.finite_checks == {0: "frames", 1: "h", 2: "c"}
    assert len(cluster.output_names) == cluster.n_outputs + 1 and cluster.output_names[-1] == "qlower_input_sum"


@pytest.mark.parametrize("position", [0, 1, 2])
def test_nan_in_any_input_runs_the_call_in_pytorch(lstm, position):
    model, x, cm, cluster = lstm
    before = cluster.info.nonfinite_calls or 0
    bad = list(x)
    bad[position] = bad[position].clone()
    bad[position].view(-1)[3] = math.nan if position != 1 else math.inf
    got, want = cm(*bad), model(*bad)
    for g, w in zip(got, want):
        assert torch.equal(torch.isnan(g), torch.isnan(w))
        torch.testing.assert_close(g.nan_to_num(0.0), w.nan_to_num(0.0), rtol=1e-4, atol=1e-5)
    assert cluster.info.nonfinite_calls == before + 1


def test_finite_inputs_whose_sum_overflows_stay_on_the_engine(lstm):
    _, x, cm, cluster = lstm
    before = cluster.info.nonfinite_calls or 0
    big = (torch.full_like(x[0], 3e38),) + tuple(x[1:])
    cm(*big)
    assert (cluster.info.nonfinite_calls or 0) == before


def _bad_calls(x):
    a, b, c = x
    return [
        ((a.double(), b, c), "expected dtype float32, got float64"),
        ((a[:, :10], b, c), "dim 1 must be 20"),
        ((a[0], b, c), "expected rank 3"),
        ((a, b), "expected 3 input"),
        ((a, b, c, c), "expected 3 input"),
        ((a, b, 1.0), "expected a tensor"),
    ]


@pytest.mark.parametrize("case", range(6))
def test_refused_inputs_are_typed_errors_and_the_cluster_stays(lstm, case):
    _, x, cm, _ = lstm
    args, match = _bad_calls(x)[case]
    with pytest.raises(InputError, match=match):
        cm(*args)
    _assert_still_on_the_engine(cm)
    cm(*x)
    _assert_still_on_the_engine(cm)


def test_inputs_numpy_cannot_view_directly_take_the_general_path(lstm):
    """A tensor that requires grad (numpy() refuses it) and a non-contiguous one (the session
    copies it): the same answer as plain inputs."""
    _, x, cm, _ = lstm
    plain = cm(*x)
    grad = (x[0].clone().requires_grad_(),) + tuple(x[1:])
    wide = torch.zeros(1, 20, 80)
    wide[..., ::2] = x[0]
    sliced = (wide[..., ::2],) + tuple(x[1:])
    assert not sliced[0].is_contiguous()
    for args in (grad, sliced):
        assert all(torch.equal(g, w) for g, w in zip(cm(*args), plain))
    _assert_still_on_the_engine(cm)


def test_near_miss_dynamic_dims_keep_the_python_check():
    """A dynamic dim's declared range is not the session's to check: no whole-call path."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    x = torch.randn(3, 8)
    cm = qlower.compile(model, (x,), backend="onnxruntime",
                        dynamic_shapes=({0: torch.export.Dim("batch", min=2, max=16)},))
    assert cm._validating_run is None
    with pytest.raises(InputError, match="outside its declared range"):
        cm(torch.randn(17, 8))
    static = qlower.compile(model, (x,), backend="onnxruntime")
    assert static._validating_run is not None
    torch.testing.assert_close(static(x), cm(x), rtol=0, atol=0)


@pytest.mark.parametrize("make", [
    lambda x: (x * 2).to(torch.bfloat16),        # bfloat16 output: widened in the session
], ids=["bfloat16-output"])
def test_near_miss_outputs_converted_in_python_keep_the_general_path(make):
    """A cluster whose outputs are converted after the session (bfloat16 from float32) gets no
    whole call: its outputs keep their dtype."""
    class M(torch.nn.Module):
        def forward(self, x):
            return make(x)
    x = torch.randn(3, 8)
    cm = qlower.compile(M(), (x,), backend="onnxruntime")
    _assert_still_on_the_engine(cm)
    assert cm._validating_run is None
    got, want = cm(x), M()(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
