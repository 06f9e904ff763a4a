"""Bad values and bad tensors (docs/trust.md): where eager raises on an index out of range or an
integer division by zero, every engine raises too or keeps the op in PyTorch (never a number);
meta-device and sparse tensors are typed errors at compile and at call; compile from several
threads; int8 compiles of models with nothing to quantize, float64 inputs, data-dependent
lengths and float16 batched matmuls."""
import threading
import time
import warnings

import pytest
import torch

import qlower
from qlower.errors import InputError

from conftest import HAS_IREE, HAS_OPENVINO

# the engines whose kernels do not check indices or divisors themselves
CHECKING = [pytest.param("openvino", marks=pytest.mark.skipif(not HAS_OPENVINO, reason="openvino not installed")),
            pytest.param("iree", marks=pytest.mark.skipif(not HAS_IREE, reason="iree not installed"))]
ALL = ["reference", "onnxruntime"] + CHECKING
_RUNNER = {"openvino": "OvCluster", "iree": "IreeCluster"}


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.e = torch.nn.Embedding(10, 4)

    def forward(self, ids):
        return self.e(ids) * 2


class EmbedShifted(Embed):
    def forward(self, ids):
        return self.e(ids + 3) * 2     # an index computed inside the program


class FloorDiv(torch.nn.Module):
    def forward(self, a, b):
        return a // b + 1


class Remainder(torch.nn.Module):
    def forward(self, a, b):
        return a % b + 1


def _engine_clusters(cm, backend: str) -> list:
    return [m for m in cm._executable.module.modules() if type(m).__name__ == _RUNNER[backend]]


def _compile(model, example, backend, quantize=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model.eval() if isinstance(model, torch.nn.Module) else model
        return qlower.compile(model, example, backend=backend, quantize=quantize,
                              calibration=[example] if quantize else None)


@pytest.mark.parametrize("quantize", [None, "int8"], ids=["float", "int8"])
@pytest.mark.parametrize("bad", [12, -1])
@pytest.mark.parametrize("backend", CHECKING)
def test_embedding_index_out_of_range_raises_as_in_eager_not_a_row(backend, bad, quantize):
    torch.manual_seed(0)
    model = Embed().eval()
    good, wrong = torch.tensor([1, 2, 3]), torch.tensor([1, bad, 3])
    with pytest.raises(IndexError):
        model(wrong)
    program = model if quantize is None else qlower.quantize(model, (good,), [(good,)], config=quantize,
                                                              backend=backend)
    cm = _compile(program, (good,), backend)
    (cluster,) = _engine_clusters(cm, backend)
    assert cluster.argument_check is not None          # the embedding runs in the engine, checked on the host
    assert all(c.status == "compiled" for c in cm.report().clusters)
    # the engine alone answers with a number (the bug this check closes)
    check, cluster.argument_check = cluster.argument_check, None
    assert isinstance(cm(wrong), torch.Tensor)
    cluster.argument_check = check
    with pytest.raises(IndexError, match="index out of range"):
        cm(wrong)
    want = model(good) if quantize is None else _compile(program, (good,), "reference")(good)
    torch.testing.assert_close(cm(good), want, atol=0, rtol=0)
    assert all(c.status == "compiled" for c in cm.report().clusters)   # a refused call changes nothing


@pytest.mark.parametrize("model", [FloorDiv, Remainder])
@pytest.mark.parametrize("backend", CHECKING)
def test_integer_division_by_zero_raises_as_in_eager_not_a_number(backend, model):
    a, b, zero = torch.tensor([7, -7, 5]), torch.tensor([2, 3, 1]), torch.tensor([2, 0, 1])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        model()(a, zero)
    cm = _compile(model(), (a, b), backend)
    (cluster,) = _engine_clusters(cm, backend)
    check, cluster.argument_check = cluster.argument_check, None
    got = cm(a, zero)                                  # the engine alone: a number
    assert got.dtype == torch.int64 and got.numel() == 3
    cluster.argument_check = check
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        cm(a, zero)
    assert torch.equal(cm(a, b), model()(a, b))


@pytest.mark.parametrize("backend", CHECKING)
def test_a_computed_index_keeps_its_embedding_in_pytorch(backend):
    torch.manual_seed(0)
    model = EmbedShifted().eval()
    cm = _compile(model, (torch.tensor([1, 2, 3]),), backend)
    reasons = [c.reason or "" for c in cm.report().clusters if c.backend != backend]
    assert any("aten::embedding" in r and "computed in the program" in r for r in reasons), reasons
    with pytest.raises(IndexError):
        cm(torch.tensor([1, 7, 3]))                    # 7 + 3 is out of a 10-row table
    x = torch.tensor([0, 6, 2])
    torch.testing.assert_close(cm(x), model(x))


@pytest.mark.parametrize("backend", CHECKING)
def test_constant_indices_into_a_table_need_no_check(backend):
    """BERT's position and token-type ids are slices of constant buffers: checked at compile time,
    so a whole transformer embedding stays one engine cluster."""
    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = torch.nn.Embedding(10, 4), torch.nn.Embedding(8, 4)
            self.register_buffer("position_ids", torch.arange(8).unsqueeze(0))

        def forward(self, ids):
            return self.tok(ids) + self.pos(self.position_ids[:, :ids.shape[1]])
    torch.manual_seed(0)
    model, ids = Positions().eval(), torch.tensor([[1, 2, 3]])
    cm = _compile(model, (ids,), backend)
    assert [c.status for c in cm.report().clusters if c.backend == backend] == ["compiled"]
    (cluster,) = _engine_clusters(cm, backend)
    assert [(kind, lo, hi) for _, kind, lo, hi in cluster.argument_check.checks] == [("index", 0, 10)]  # the ids only
    torch.testing.assert_close(cm(ids), model(ids))


# ---------------------------------------------------------------- meta and sparse tensors
_BAD_TENSORS = {
    "meta": (lambda x: torch.empty_like(x, device="meta"), "meta device", "with values"),
    "sparse_coo": (lambda x: x.to_sparse(), "sparse_coo tensor", "to_dense"),
    "sparse_csr": (lambda x: x.to_sparse_csr(), "sparse_csr tensor", "to_dense"),
}


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x).relu()


@pytest.mark.parametrize("kind", sorted(_BAD_TENSORS))
@pytest.mark.parametrize("backend", ALL)
def test_meta_and_sparse_inputs_are_input_errors_at_compile_and_call(backend, kind):
    make, match, hint = _BAD_TENSORS[kind]
    x = torch.randn(2, 4)
    with pytest.raises(InputError, match=f"example input 0 .*{match}") as err:
        qlower.compile(Linear(), (make(x),), backend=backend)
    assert hint in err.value.hint
    model = Linear().eval()
    cm = qlower.compile(model, (x,), backend=backend)
    with pytest.raises(InputError, match=f"input 0 \\('x'\\): .*{match}") as err:
        cm(make(x))
    assert hint in err.value.hint
    # the refused call reached no engine: nothing fell back, and the next call is the engine's
    assert all(c.status == "compiled" for c in cm.report().clusters if c.backend == backend)
    torch.testing.assert_close(cm(x), model(x))


# ---------------------------------------------------------------- compile from several threads
class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.c(x).sigmoid()


class Wide(torch.nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.fc = torch.nn.Linear(8, k)

    def forward(self, x):
        return torch.relu(self.fc(x)) + 1


def test_compile_from_four_threads_at_once_gives_four_right_models():
    """Unserialized, one of the threads failed in every round with a CaptureError ("Trying to pop
    empty mode stack", "_EXPORT_MODULE_HIERARCHY must not be None") and a hint to rewrite the
    model; capture.COMPILE_LOCK runs the compiles one at a time."""
    errors, results = [], {}
    start = threading.Barrier(4)

    def work(i: int) -> None:
        torch.manual_seed(i)
        model, x = (Wide(4 + i), torch.randn(2, 8)) if i % 2 == 0 else (Conv(), torch.randn(1, 3, 8, 8))
        try:
            start.wait()
            cm = qlower.compile(model.eval(), (x,), backend="reference")
            results[i] = (cm(x), model(x))
        except Exception as exc:  # noqa: BLE001  (reported by the assertion below)
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")

    for _ in range(2):
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert sorted(results) == [0, 1, 2, 3]
    for got, want in results.values():
        torch.testing.assert_close(got, want)


# ---------------------------------------------------------------- int8 of unusual models
class ConstantOutputs(torch.nn.Module):
    def forward(self, x):
        return (1.0, 2.0)             # Python numbers: no tensor for an observer


class Float64Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3).double()

    def forward(self, x):
        return self.fc(x).relu()


class HalfBmm(torch.nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)


def test_int8_of_a_model_with_nothing_to_quantize_compiles_as_float_and_says_so():
    """backend='auto' compared the candidates' SQNR over output tensors: with none, a raw
    `ValueError: torch.cat(): expected a non-empty list of Tensors`."""
    x = torch.randn(2, 3)
    cm = qlower.compile(ConstantOutputs(), (x,), quantize="int8", calibration=[(x,)],
                        auto_candidates=("onnxruntime",) + (("openvino",) if HAS_OPENVINO else ()))
    assert cm(x) == (1.0, 2.0)
    assert not cm.report().quantized
    assert any("nothing to quantize" in n for n in cm.report().notes), cm.report().notes


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
def test_int8_of_a_float64_model_is_a_quantize_error(backend):
    x = torch.randn(2, 4, dtype=torch.float64)
    with pytest.raises(qlower.QuantizeError, match="float64") as err:
        qlower.compile(Float64Linear().eval(), (x,), backend=backend, quantize="int8", calibration=[(x,)])
    assert "model.float()" in err.value.hint
    model = Float64Linear().eval()   # float compiles keep float64
    assert qlower.compile(model, (x,), backend=backend)(x).dtype == torch.float64


@pytest.mark.parametrize("backend", ALL)
def test_int8_keeps_a_float16_batched_matmuls_output_dtype(backend):
    """The Q/DQ program dequantizes to float16, the integer lowering to float32: the output
    came back float32."""
    torch.manual_seed(0)
    a, b = torch.randn(2, 3, 4).half(), torch.randn(2, 4, 5).half()
    assert HalfBmm()(a, b).dtype == torch.float16
    program = qlower.quantize(HalfBmm(), (a, b), [(a, b)], config="int8", backend=backend)
    got, want = _compile(program, (a, b), backend)(a, b), _compile(program, (a, b), "reference")(a, b)
    assert got.dtype == torch.float16 and want.dtype == torch.float16
    torch.testing.assert_close(got, want, atol=0, rtol=0)


class NarrowAtATensor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x, start):
        return self.fc(torch.narrow(x, 0, start, 2))   # a start that is a tensor: an unbacked offset


@pytest.mark.parametrize("quantize", [None, "int8"], ids=["float", "int8"])
def test_a_narrow_at_a_tensor_offset_is_a_capture_error_with_an_honest_hint(quantize):
    """Plain torch.export raises PendingUnbackedSymbolNotFound for it; the generic hint ("rewrite
    the unsupported code path") did not say what to change."""
    from torch.fx.experimental.symbolic_shapes import PendingUnbackedSymbolNotFound
    ex = (torch.randn(5, 3), torch.tensor(2))
    with pytest.raises(PendingUnbackedSymbolNotFound):
        torch.export.export(NarrowAtATensor(), ex)
    with pytest.raises(qlower.CaptureError, match="Pending unbacked symbols") as err:
        qlower.compile(NarrowAtATensor().eval(), ex, backend="reference", quantize=quantize,
                       calibration=[ex] if quantize else None)
    assert "Python int" in err.value.hint and "rewrite the unsupported" not in err.value.hint


class Rows(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(10, 4))

    def forward(self, i):
        return self.table[i] * 2          # Python indexing: -10..9 are rows, as in eager


@pytest.mark.parametrize("backend", CHECKING)
def test_negative_indices_eager_accepts_stay_in_the_engine_and_match(backend):
    torch.manual_seed(0)
    model = Rows().eval()
    cm = _compile(model, (torch.tensor([1, 2, 3]),), backend)
    (cluster,) = _engine_clusters(cm, backend)
    assert [(kind, lo, hi) for _, kind, lo, hi in cluster.argument_check.checks] == [("index", -10, 10)]
    i = torch.tensor([-10, -1, 9])
    torch.testing.assert_close(cm(i), model(i))
    assert cluster.argument_check(cluster._all_args((i,)) if backend == "openvino" else (i,))
    with pytest.raises(IndexError):
        cm(torch.tensor([0, 10, 1]))


def test_a_compile_left_running_by_auto_finishes_before_the_next_compile_starts():
    """auto abandons a candidate's compile at its time budget but cannot stop it (engine_choice
    ._bounded); its passes trace, so the next compile waits for it instead of tracing beside it."""
    from qlower.capture import _LEFT_RUNNING, leave_running, serialized
    finished = threading.Event()

    def slow_compile() -> None:
        time.sleep(0.3)
        finished.set()

    worker = threading.Thread(target=slow_compile)
    worker.start()
    leave_running(worker)
    seen = []
    serialized(lambda: seen.append(finished.is_set()))()
    assert seen == [True] and not _LEFT_RUNNING
    nested = threading.Thread(target=time.sleep, args=(0.3,))
    # inside a compile (the lock held by this thread) a call does not wait: the compile that left
    # the work running is the caller, and it waits at its next outermost call
    serialized(lambda: (nested.start(), leave_running(nested),
                                serialized(lambda: seen.append(nested.is_alive()))()))()
    assert seen == [True, True]
    serialized(lambda: seen.append(nested.is_alive()))()
    assert seen == [True, True, False]
