"""A catalogue of bad inputs: each is a typed QlowerError with a hint that fits it, or a
documented, tested success (docs/trust.md). Also the NaN/inf policy and thread safety."""
import threading
import warnings

import pytest
import torch

import qlower
from qlower.errors import (ArtifactError, CaptureError, InputError, NonFiniteInputError, NonFiniteInputWarning,
                           QuantizeError)

from conftest import calib, pipeline_without_empty_folding


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


class TwoArgs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x, bias):
        return self.fc(x) + bias


class Branch(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:          # data-dependent Python control flow
            return x * 2
        return x - 1


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.register_buffer("n", torch.zeros(()))

    def forward(self, x):
        self.n.add_(1)
        return self.fc(x) * 0 + self.n


def _net():
    torch.manual_seed(0)
    return Net().eval(), torch.randn(2, 8)


def _raising_generator(x):
    yield (x,)
    raise RuntimeError("the data loader died")


def _nan(x):
    y = x.clone()
    y[0, 0] = float("nan")
    return y


CALIBRATION_CASES = {
    "wrong shape": (lambda x: [(torch.randn(2, 9),)], "dim 1 must be 8", "static dims"),
    "wrong dtype": (lambda x: [(x.double(),)], "expected dtype float32, got float64", "dtypes"),
    "NaN": (lambda x: [(x,), (_nan(x),)], "batch 1, input 0 holds NaN/inf", "nan_to_num"),
    "inf": (lambda x: [(x / 0,)], "holds NaN/inf", "nan_to_num"),
    "not iterable": (lambda x: 5, "iterable of input tuples, got int", "tuples"),
    "bare tensor": (lambda x: x, "bare tensor", "[(x,)]"),
    "generator raises": (lambda x: _raising_generator(x), "raised RuntimeError: the data loader died",
                         "iterable itself failed"),
    "batch not a tuple": (lambda x: ["x"], "batch 0 is not an input tuple", "tuples"),
    "too many inputs": (lambda x: [(x, x)], r"has 2 input\(s\), the model takes 1", "tuples"),
    "empty": (lambda x: [], "empty", "at least one"),
}


@pytest.mark.parametrize("case", CALIBRATION_CASES)
def test_bad_calibration_is_a_quantize_error(case):
    make, match, hint = CALIBRATION_CASES[case]
    model, x = _net()
    with pytest.raises(QuantizeError, match=match) as info:
        qlower.compile(model, (x,), quantize="int8", calibration=make(x), backend="reference")
    assert hint in info.value.hint
    with pytest.raises(QuantizeError, match=match):
        qlower.quantize(model, (x,), make(x))


@pytest.mark.parametrize("value", [True, 8, object()])
def test_quantize_must_be_a_preset_or_config(value):
    model, x = _net()
    with pytest.raises(QuantizeError, match="not a quantization setting") as info:
        qlower.compile(model, (x,), quantize=value, calibration=[(x,)], backend="reference")
    assert "'int8'" in info.value.hint


def test_data_dependent_control_flow_is_a_capture_error_with_source_line():
    with pytest.raises(CaptureError, match="data-dependent") as info:
        qlower.compile(Branch(), (torch.randn(2, 8),), backend="reference")
    line = Branch.forward.__code__.co_firstlineno + 1
    assert info.value.source and info.value.source.endswith(f"test_bad_inputs.py:{line}")
    assert "torch.cond" in info.value.hint


def test_parameters_on_the_meta_device_are_a_capture_error():
    with torch.device("meta"):
        model = Net()
    with pytest.raises(CaptureError, match="'fc.weight' is on the meta device") as info:
        qlower.compile(model, (torch.randn(2, 8),), backend="reference")
    assert "to_empty" in info.value.hint


def test_int64_example_input_for_a_float_model_is_a_capture_error():
    model, x = _net()
    with pytest.raises(CaptureError) as info:
        qlower.compile(model, (x.long(),), backend="reference")
    assert "dtype" in info.value.hint


def _compiled(backend="reference", **kw):
    model, x = _net()
    return qlower.compile(model, (x,), quantize="int8", calibration=calib((2, 8)), backend=backend, **kw), x


@pytest.mark.parametrize("args,kwargs,match,hint", [
    ((torch.randint(0, 5, (2, 8)),), {}, "expected dtype float32, got int64", ".to(torch.float32)"),
    ((torch.randn(3, 8),), {}, "dim 0 must be 2", "dynamic_shapes="),
    ((), {"y": torch.randn(2, 8)}, r"unknown keyword\(s\) \['y'\]", "takes (x)"),
    ((torch.randn(2, 8),), {"x": torch.randn(2, 8)}, "multiple values", "takes (x)"),
])
def test_bad_calls_are_input_errors_with_fitting_hints(args, kwargs, match, hint):
    cm, _ = _compiled()
    with pytest.raises(InputError, match=match) as info:
        cm(*args, **kwargs)
    assert hint in info.value.hint


@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "iree", "openvino"])
def test_keyword_calls_bind_by_the_models_parameter_names(backend, tmp_path):
    torch.manual_seed(0)
    model = TwoArgs().eval()
    x, b = torch.randn(2, 8), torch.randn(4)
    cm = qlower.compile(model, (x, b), quantize="int8", calibration=[(x, b)], backend=backend)
    want = cm(x, b)
    assert torch.equal(cm(x=x, bias=b), want) and torch.equal(cm(x, bias=b), want)
    assert torch.equal(qlower.load(cm.save(tmp_path / "kw.pt2"))(bias=b, x=x), want)
    with pytest.raises(InputError, match=r"missing argument\(s\) \['bias'\]"):
        cm(x=x)


@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "iree", "openvino"])
def test_dynamic_dim_beyond_its_declared_range_is_an_input_error(backend, tmp_path):
    model, _ = _net()
    batch = torch.export.Dim("batch", min=1, max=4)
    cm = qlower.compile(model, (torch.randn(2, 8),), quantize="int8", calibration=calib((2, 8)), backend=backend,
                        dynamic_shapes={"x": {0: batch}})
    assert cm(torch.randn(1, 8)).shape == (1, 4) and cm(torch.randn(4, 8)).shape == (4, 4)
    for cm_ in (cm, qlower.load(cm.save(tmp_path / "dyn.pt2"))):
        with pytest.raises(InputError, match=r"dynamic dim 0 is 5, outside its declared range \[1, 4\]") as info:
            cm_(torch.randn(5, 8))
        assert "Dim(min=..., max=...)" in info.value.hint


def test_size_one_under_dim_auto_names_the_special_case():
    """Dim.AUTO starts at 2 (export traces 0 and 1 apart): batch 1 is an InputError whose hint
    says why and how to include it (it suggested a wider Dim(min, max), which did not explain)."""
    model, _ = _net()
    cm = qlower.compile(model, (torch.randn(3, 8),), backend="reference",
                        dynamic_shapes={"x": {0: torch.export.Dim.AUTO}})
    assert cm(torch.randn(7, 8)).shape == (7, 4)
    with pytest.raises(InputError, match=r"dynamic dim 0 is 1, outside its declared range \[2, inf\]") as info:
        cm(torch.randn(1, 8))
    assert "Dim('name', min=0)" in info.value.hint and "0 and 1" in info.value.hint


class _PositionTable(torch.nn.Module):
    """Position embeddings from a 64-entry table, sliced to the input's length (BERT's)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("pos", torch.arange(64)[None, :])
        self.emb = torch.nn.Embedding(64, 8)

    def forward(self, ids):
        return self.emb(self.pos[:, : ids.shape[1]])


def test_declared_dim_range_the_model_cannot_take_names_the_range_and_the_fix():
    """A sequence declared up to 128 on a 64-position table: torch.export's first line alone
    ("Constraints violated (seq)!") named neither the range nor the fix; the CaptureError now
    carries both (torch's suggested Dim). Near miss: max=64 compiles."""
    ids = torch.zeros(2, 8, dtype=torch.int64)
    with pytest.raises(CaptureError, match=r"declared dynamic shapes do not hold: .*seq <= 128") as info:
        qlower.compile(_PositionTable(), (ids,), dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=128)},),
                       backend="reference")
    assert "Dim('seq', max=64)" in info.value.hint
    cm = qlower.compile(_PositionTable(), (ids,), dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=64)},),
                        backend="reference")
    assert cm(torch.zeros(2, 64, dtype=torch.int64)).shape == (1, 64, 8)


class _SpecialCaseOfTwo(torch.nn.Module):
    """A branch on the sequence length (MobileBERT's guard is `seq - 1 != 1`)."""

    def forward(self, x):
        if x.shape[1] == 2:
            return x * 2
        return x + 1


def test_declared_dim_range_with_an_excluded_size_suggests_the_range_that_holds():
    """torch.export names the guard (`seq != 2`) but suggests no fix; qlower evaluates the guard
    over the declared range and names the Dim that holds. Near miss: min=3 compiles."""
    x = torch.zeros(2, 8)
    with pytest.raises(CaptureError, match="declared dynamic shapes do not hold") as info:
        qlower.compile(_SpecialCaseOfTwo(), (x,), dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=64)},),
                       backend="reference")
    assert "Dim('seq', min=3, max=64)" in info.value.hint
    cm = qlower.compile(_SpecialCaseOfTwo(), (x,), dynamic_shapes=({1: torch.export.Dim("seq", min=3, max=64)},),
                        backend="reference")
    assert torch.equal(cm(torch.zeros(2, 5)), torch.ones(2, 5))


@pytest.mark.parametrize("guard,holds", [
    ("((-1) + seq) != 1", [3, 4, 5, 6]),
    ("Eq(Mod(seq, 2), 0)", [2, 4, 6]),
    ("3 <= seq and seq <= 5", [3, 4, 5]),
    ("not seq < 4", [4, 5, 6]),
])
def test_guard_predicates_as_torch_prints_them(guard, holds):
    from qlower.capture import _guard_predicate
    pred = _guard_predicate(guard, "seq")
    assert [v for v in range(2, 7) if pred(v)] == holds


def test_a_guard_form_not_read_gives_no_suggestion():
    from qlower.capture import _range_fix
    why = ("Not all values of seq = L['x'].size()[1] in the specified range seq <= 64 satisfy the "
           "generated guard __import__('os').getpid() != 2.")
    assert _range_fix(why, ({1: torch.export.Dim("seq", min=2, max=64)},)) is None


def test_unknown_nan_policy_is_an_input_error():
    model, x = _net()
    with pytest.raises(InputError, match="nan_policy"):
        qlower.compile(model, (x,), backend="reference", nan_policy="sometimes")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "iree", "openvino"])
def test_float_models_keep_their_dtype(dtype, backend):
    torch.manual_seed(0)
    model = Net().to(dtype).eval()
    x = torch.randn(2, 8, dtype=dtype)
    cm = qlower.compile(model, (x,), backend=backend)
    out = cm(x)
    assert out.dtype == dtype
    if backend in ("reference", "onnxruntime"):
        # onnxruntime: these dtypes are outside its capability, so the ops run in PyTorch: identical
        assert torch.equal(out, model(x))
    else:   # an engine's float kernels: float tolerance of the dtype (iree's fp16 linear rounds differently)
        torch.testing.assert_close(out, model(x))
    if backend == "iree" and dtype is torch.bfloat16:   # numpy has no bfloat16: refused up front, not a run failure
        reasons = [c.reason for c in cm.report().clusters if c.status == "fallback"]
        assert reasons and all("no numpy equivalent" in r for r in reasons), reasons


# ---------------------------------------------------------------- NaN/inf policy

class _FloatOp(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        y = x * 2.0   # a cluster of more than one op
        if self.kind == "max_pool":
            return torch.nn.functional.max_pool2d(y, 2)
        if self.kind == "sort":
            return y.sort(-1).values
        if self.kind == "clamp":
            return y.clamp(-1.0, 1.0)
        if self.kind == "maximum":
            return torch.maximum(y, y.flip(-1))
        if self.kind == "argmax":
            return y.argmax(-1)
        return torch.nn.functional.gelu(y)


# Measured without the per-call check, on [nan, 1, 2, 3] / [inf, -inf, 0.5, -2] rows:
# onnxruntime max_pool inf (eager nan), sort puts NaN third (eager last), gelu(inf) inf (eager
# nan); iree clamp -1, maximum 3, argmax 3, sort NaN first; openvino max_pool -3.4e38.
@pytest.mark.parametrize("kind", ["max_pool", "sort", "clamp", "maximum", "argmax", "gelu"])
@pytest.mark.parametrize("backend", ["onnxruntime", "iree", "openvino"])
def test_float_model_with_nan_or_inf_input_answers_as_eager(backend, kind):
    """Engines propagate NaN/inf their own way; a call whose cluster input holds one runs that
    cluster in PyTorch (counted in the report), and finite calls stay on the engine."""
    m = _FloatOp(kind)
    x = torch.randn(1, 1, 2, 4)
    cm = qlower.compile(m, (x,), backend=backend)
    if backend == "openvino" and kind == "sort":   # refused: OpenVINO's TopK scrambled sorts (docs/openvino.md)
        assert [list(c.ops) for c in cm.report().fallbacks] == [["sort"]]
        bad = torch.tensor([[[[float("nan"), 1.0, 2.0, 3.0], [float("inf"), -float("inf"), 0.5, -2.0]]]])
        assert torch.equal(cm(bad).nan_to_num(0.0), m(bad).nan_to_num(0.0))
        return
    assert not cm.report().fallbacks
    bad = torch.tensor([[[[float("nan"), 1.0, 2.0, 3.0], [float("inf"), -float("inf"), 0.5, -2.0]]]])
    want, got = m(bad), cm(bad)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(torch.isnan(got), torch.isnan(want)) if want.is_floating_point() else True
    assert (torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0)) if want.is_floating_point()
            else torch.equal(got, want))
    assert torch.equal(cm(x), cm(x)) and cm.report().compiled[0].nonfinite_calls == 1
    assert "1 call(s) with NaN/inf inputs ran in PyTorch" in str(cm.report())


@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "iree", "openvino"])
def test_nan_input_of_a_quantized_model_warns_once_by_default(backend):
    cm, x = _compiled(backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm(_nan(x))
        cm(_nan(x))
        cm(x / 0)
    assert [w.category for w in caught] == [NonFiniteInputWarning]
    assert "NaN/inf" in str(caught[0].message)


@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "iree", "openvino"])
def test_nan_policy_raise_is_a_typed_error_and_ignore_is_silent(backend):
    cm, x = _compiled(backend, nan_policy="raise")
    with pytest.raises(NonFiniteInputError, match="holds NaN/inf") as info:
        cm(_nan(x))
    assert isinstance(info.value, InputError) and info.value.hint
    cm(x)   # finite inputs are fine
    cm(torch.full_like(x, 3e38))   # finite, but its sum overflows: the exact check clears it
    quiet, _ = _compiled(backend, nan_policy="ignore")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet(_nan(x))


def _engine_checked(backend: str):
    """A quantized model whose NaN check the backend's executable took over: (cm, x, cluster)."""
    cm, x = _compiled(backend, nan_policy="raise")
    assert cm._float_inputs == [] and cm._executable.engine_checked_inputs == {"x"}
    cluster = next(m for m in cm._executable.module.children() if hasattr(m, "finite_checks"))
    assert cluster.finite_checks == {0: "x"}
    return cm, x, cluster


def _assert_float_model_not_checked(backend: str) -> None:
    model, x = _net()
    fp32 = qlower.compile(model, (x,), backend=backend, nan_policy="raise")
    assert fp32._executable.engine_checked_inputs == frozenset()
    out = fp32(_nan(x))   # no NonFiniteInputError: eager's answer (the call ran in PyTorch)
    torch.testing.assert_close(out, model(_nan(x)), equal_nan=True)


def test_onnxruntime_sums_the_inputs_inside_the_session_and_still_checks_after_a_fallback():
    """The NaN check of a quantized model's float32 inputs runs in the cluster's session (one
    output: the sum of one ReduceSum per input) (a torch reduction before each run cost ~16 us per call on small
    models); the exported ONNX has no such output; a cluster that fell back to PyTorch at run
    time checks in PyTorch. Near miss: a float model's NaN policy is not engaged (its sessions sum
    their inputs too, but only to run a NaN/inf call in PyTorch)."""
    cm, x, cluster = _engine_checked("onnxruntime")
    assert len(cluster.output_names) == cluster.n_outputs + 1
    assert "qlower_input_sum" not in str(cm.report().clusters[0].onnx)
    # the same program on the reference backend (quantized for onnxruntime: 7-bit weights
    # without VNNI)
    program = qlower.quantize(_net()[0], (x,), calib((2, 8)), "int8", backend="onnxruntime")
    assert torch.equal(cm(x), qlower.compile(program, (x,), backend="reference")(x))
    cluster.session = None   # as after a run failure
    with pytest.raises(NonFiniteInputError):
        cm(_nan(x))
    _assert_float_model_not_checked("onnxruntime")


def test_iree_sums_the_inputs_it_hands_to_iree_and_still_checks_after_a_fallback():
    """IREE's runner sums a quantized model's float32 inputs with numpy on the arrays it hands
    to IREE (torch's sum after an IREE call cost ~100 us more per call on the zoo CNN at batch
    8: its dispatch code is no longer cached), silently (max - min: nothing overflows);
    a cluster that fell back checks too. Near miss: a float model's NaN policy is not engaged."""
    cm, x, cluster = _engine_checked("iree")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cm(torch.full_like(x, 3e38))   # finite: no warning
    with pytest.raises(NonFiniteInputError):
        cm(torch.where(torch.arange(x.numel()).view_as(x) == 0, float("inf"), -float("inf")))
    cluster.function = None   # as after a run failure
    with pytest.raises(NonFiniteInputError):
        cm(_nan(x))
    _assert_float_model_not_checked("iree")


def test_float_models_follow_ieee_and_are_not_checked():
    model, x = _net()
    cm = qlower.compile(model, (x,), backend="reference", nan_policy="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = cm(_nan(x))
    assert torch.isnan(out[0]).any() and torch.equal(out[1], model(x)[1])


# ---------------------------------------------------------------- threads

def _hammer(cm, x, threads=2, calls=2000):
    errors = []

    def work():
        try:
            for _ in range(calls):
                cm(x)
        except Exception as exc:  # surfaced below: a failing thread must fail the test
            errors.append(exc)
    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "iree", "openvino"])
def test_stateful_model_serializes_calls_so_no_update_is_lost(backend):
    torch.manual_seed(0)
    cm = qlower.compile(Counter().eval(), (torch.randn(1, 8),), backend=backend)
    assert cm.stateful
    x = torch.randn(1, 8)
    _hammer(cm, x)
    assert cm(x)[0, 0].item() == 4001


@pytest.mark.parametrize("backend", ["onnxruntime", "iree", "openvino"])
def test_stateless_model_runs_concurrently_and_stays_correct(backend):
    cm, x = _compiled(backend=backend)
    assert not cm.stateful
    want = cm(x)
    results = []

    def work():
        results.extend(torch.equal(cm(x), want) for _ in range(500))
    pool = [threading.Thread(target=work) for _ in range(2)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert len(results) == 1000 and all(results)
    # and still on the engine: a shared OpenVINO infer request once raised "Infer Request is
    # busy" here and the cluster fell back to PyTorch for good, with the outputs still equal
    assert [(c.backend, c.status) for c in cm.report().clusters] == [(backend, "compiled")]


def test_artifact_errors_are_qlower_errors():
    assert issubclass(ArtifactError, qlower.QlowerError) and issubclass(NonFiniteInputError, InputError)


class _KZero(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b) + 1


@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "iree", "openvino"])
def test_empty_reduction_matmul_gives_eager_zeros(backend):
    """K = 0: the product is all zeros in eager (was uninitialized memory, different per run)."""
    a, b = torch.randn(2, 0), torch.randn(0, 3)
    cm = qlower.compile(_KZero(), (a, b), backend=backend)
    for _ in range(3):
        assert torch.equal(cm(a, b), torch.ones(2, 3))


class _MatVec(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)


def test_int8_linear_on_a_1d_input_compiles_and_runs():
    """A 1-D linear (mat-vec) raised a raw IndexError at int8 compile."""
    torch.manual_seed(0)
    model, x = _MatVec().eval(), torch.randn(8)
    ep = qlower.quantize(model, (x,), [(torch.randn(8),) for _ in range(4)], backend="onnxruntime")
    cm, ref = qlower.compile(ep, (x,), backend="onnxruntime"), qlower.compile(ep, (x,), backend="reference")
    assert not cm.report().fallbacks
    assert torch.equal(cm(x), ref(x)) and cm(x).shape == (4,)


def test_model_computing_nan_on_finite_calibration_is_a_typed_error_naming_the_node():
    """Found by the fuzz run: on a width-1 input, a dilated max-pool window lying entirely in the
    padding gives -inf and the group_norm after it NaN; the observer's NaN range, unchecked, fails
    inside convert as a raw AssertionError ("min nan should be less than max nan"). Near miss:
    without dilation every window touches the input and the model quantizes."""
    class Net(torch.nn.Module):
        def __init__(self, dilation):
            super().__init__()
            self.fc, self.dilation = torch.nn.Linear(4, 1), dilation

        def forward(self, x):
            h = torch.nn.functional.max_pool2d(self.fc(x), 2, stride=1, padding=1, dilation=self.dilation,
                                               ceil_mode=True)
            return torch.nn.functional.group_norm(h, 1)

    x = torch.randn(1, 1, 5, 4)
    cal = [(torch.randn(1, 1, 5, 4),) for _ in range(2)]
    bad = Net(dilation=2).eval()
    assert not torch.isfinite(bad(x)).all()     # the float model itself is non-finite here
    with pytest.raises(qlower.QuantizeError, match="non-finite value") as info:
        qlower.quantize(bad, (x,), cal)
    assert info.value.node and info.value.source and "test_bad_inputs.py" in info.value.source
    qlower.quantize(Net(dilation=1).eval(), (x,), cal)


# ------------------------------------------------------------------ empty tensors, every backend
_F = torch.nn.functional
_EMPTY_BATCH = {
    "conv": (lambda m, x: m.conv(x), (0, 3, 6, 6)), "linear": (lambda m, x: m.fc(x), (0, 4, 5)),
    "matmul": (lambda m, x: x @ x.transpose(-1, -2), (0, 4, 5)),
    "max_pool": (lambda m, x: _F.max_pool2d(x, 2), (0, 3, 6, 6)),
    "avg_pool": (lambda m, x: _F.avg_pool2d(x, 2), (0, 3, 6, 6)),
    "layer_norm": (lambda m, x: _F.layer_norm(x, (5,)), (0, 4, 5)),
    "group_norm": (lambda m, x: _F.group_norm(x, 1), (0, 3, 6, 6)),
    "softmax": (lambda m, x: torch.softmax(x, -1), (0, 4, 5)),
    "attention": (lambda m, x: _F.scaled_dot_product_attention(x[:, None], x[:, None], x[:, None]), (0, 4, 5)),
    "amax_last": (lambda m, x: x.amax(-1), (0, 4, 5)), "argmax_last": (lambda m, x: x.argmax(-1), (0, 4, 5)),
    "sum_over_empty": (lambda m, x: x.sum(-1), (2, 4, 0)), "mean_over_empty": (lambda m, x: x.mean((0, 1)), (0, 4, 5)),
    "var_over_empty": (lambda m, x: x.var(-1), (2, 4, 0)),
    "expand": (lambda m, x: x.expand(2, -1, -1, -1).sum(0), (0, 4, 5)),
    "cat_slice": (lambda m, x: torch.cat([x[:, 1:3], x[:, :2] * 2], 1), (0, 4, 5)),
}


class _EmptyNet(torch.nn.Module):
    def __init__(self, case: str):
        super().__init__()
        self.conv, self.fc, self.case = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Linear(5, 6), case

    def forward(self, x):
        return _EMPTY_BATCH[self.case][0](self, x)


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "engine"])
@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "iree", "openvino"])
@pytest.mark.parametrize("case", sorted(_EMPTY_BATCH))
def test_empty_tensors_give_eagers_result_on_every_backend(case, backend, fold):
    """An empty batch (or an empty reduced dim) through common ops: eager's shape, dtype and
    values, and no cluster the capability accepted fails in its engine. Engines get them
    wrong: ONNX Runtime returns empty inputs to negative-axis reductions unchanged and gives
    uninitialized memory for K = 0 MatMul; IREE a variance of 0 over nothing; OpenVINO and IREE
    fail to compile several ops on empty tensors. `folded`: FoldEmptyTensors computes them at
    compile time; `engine`: without it, what the backends do when an empty tensor reaches them."""
    if backend == "iree":
        pytest.importorskip("iree.compiler")
    if backend == "openvino":
        pytest.importorskip("openvino")
    torch.manual_seed(0)
    model, x = _EmptyNet(case).eval(), torch.randn(_EMPTY_BATCH[case][1])
    passes = None if fold else pipeline_without_empty_folding()
    cm = qlower.compile(model, (x,), backend=backend, passes=passes)
    with torch.no_grad():
        want, got = model(x), cm(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(got.nan_to_num(), want.nan_to_num())
    assert not [c for c in cm.report().clusters if "failed" in (c.reason or "")]
