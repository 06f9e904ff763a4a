"""Calling a compiled IREE cluster (backends/iree/runner.py, vm.py): inputs read in place and
results handed over without copies on the CPU drivers, and every case where that must not
happen (unaligned or strided inputs, a result that is an input, an import IREE refuses)."""
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("iree.compiler", reason="the iree extra is not installed (pip install 'qlower[iree]')")
pytest.importorskip("iree.runtime", reason="the iree extra is not installed (pip install 'qlower[iree]')")

import qlower  # noqa: E402
from qlower.backends.iree import IreeOptions  # noqa: E402
from qlower.backends.iree.compiler import compile_mlir  # noqa: E402
from qlower.backends.iree.runner import IreeCluster, _as_dtype, _in_place  # noqa: E402
from qlower.backends.iree.vm import ZERO_COPY_ALIGNMENT, load_function  # noqa: E402
from qlower.report import ClusterInfo  # noqa: E402
from qlower.zoo import ZOO  # noqa: E402


@pytest.fixture(scope="module")
def int8_cnn():
    entry = ZOO["cnn"]
    x = entry.inputs(2)
    program = qlower.quantize(entry.model(), x, entry.calibration(2, batch=2), "int8", backend="iree")
    cm = qlower.compile(program, x, backend="iree", profile="fixed")
    ref = qlower.compile(program, x, backend="reference", profile="fixed")
    (cluster,) = [m for m in cm._executable.module.modules() if isinstance(m, IreeCluster)]
    return cm, ref, cluster, entry


@pytest.mark.slow
def test_results_match_the_copying_path_and_outlive_later_calls(int8_cnn):
    """In place and copied, the same bits; a result kept across later calls keeps its values
    (its capsule holds IREE's buffer, which IREE then does not reuse)."""
    cm, ref, cluster, entry = int8_cnn
    assert cluster.zero_copy
    xs = [entry.inputs(2, seed=s) for s in (3, 4, 5)]
    kept = [cm(*x) for x in xs]
    for x, k in zip(xs, kept):
        assert torch.equal(k, ref(*x))
    cluster.zero_copy = False
    try:
        assert all(torch.equal(cm(*x), k) for x, k in zip(xs, kept))
    finally:
        cluster.zero_copy = True
    assert kept[0].dtype == torch.float32 and kept[0].shape == (2, 10)


def test_unaligned_and_strided_inputs_are_copied_and_right(int8_cnn):
    cm, ref, cluster, entry = int8_cnn
    (x,) = entry.inputs(2, seed=6)
    storage = torch.empty(x.numel() + 1)
    unaligned = storage[1:].view_as(x)
    unaligned.copy_(x)
    assert unaligned.data_ptr() % ZERO_COPY_ALIGNMENT and _in_place(unaligned) is None
    strided = torch.cat([x, x], dim=3)[..., ::2]
    assert not strided.is_contiguous() and _in_place(strided) is None
    for tensor in (unaligned, strided):
        assert torch.equal(cm(tensor), ref(tensor.contiguous()))
    assert cluster.zero_copy   # those calls copied; the next aligned one does not


def test_dtypes_cross_as_the_module_takes_them():
    """uint8 crosses as its bytes viewed as int8 (the module's signless i8), and comes back so."""
    u = torch.arange(256, dtype=torch.int32).to(torch.uint8).clone()
    as_i8 = _in_place(u)
    assert as_i8.dtype == torch.int8 and as_i8.data_ptr() == u.data_ptr()
    assert torch.equal(_as_dtype(as_i8, torch.uint8), u)
    assert torch.equal(_as_dtype(torch.tensor([0, 3], dtype=torch.int8), torch.bool), torch.tensor([False, True]))
    assert _in_place(torch.zeros(0)) is None and _in_place(torch.zeros(4, dtype=torch.bool)) is None
    assert _in_place(torch.zeros(4, requires_grad=True)).requires_grad is False


def _identity_cluster() -> IreeCluster:
    text = "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n  return %x : tensor<4xf32>\n}"
    function = load_function(compile_mlir(text, "tosa", IreeOptions()).vmfb, "local-sync")
    graph = torch.fx.symbolic_trace(torch.nn.Identity())
    return IreeCluster(graph, function, [torch.float32], True, ClusterInfo(0, "iree", 1, {}), "tosa", text)


def test_a_result_that_is_the_input_itself_is_a_copy():
    """IREE returns an argument as it is when the module does (`return %x`): in place, the
    caller would get its own input back as the output, so that result is copied."""
    cluster = _identity_cluster()
    x = torch.randn(4)
    raw = torch.from_dlpack(cluster.function.call_zero_copy(x)[0])
    assert raw.data_ptr() == x.data_ptr()   # what IREE hands back: the input's memory
    out = cluster(x)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()
    x.add_(1.0)
    assert not torch.equal(out, x)


def test_an_import_iree_refuses_turns_zero_copy_off_for_good(monkeypatch):
    cluster = _identity_cluster()
    calls = []

    def refuse(*tensors):
        calls.append(len(tensors))
        raise RuntimeError("OUT_OF_RANGE; imported heap buffer data must be aligned")
    monkeypatch.setattr(cluster.function, "call_zero_copy", refuse)
    x = torch.randn(4)
    assert torch.equal(cluster(x), x) and torch.equal(cluster(x), x)
    assert calls == [1] and cluster.zero_copy is False and cluster.function is not None
    assert cluster.info.status == "compiled"


def test_gpu_functions_never_take_inputs_in_place():
    """Only the local (CPU) drivers read host memory in place; a GPU function copies (`upload`)."""
    cluster = _identity_cluster()
    cluster.function._host_local = False
    rebuilt = IreeCluster(cluster.fallback, cluster.function, [torch.float32], True, cluster.info, "tosa", None)
    assert rebuilt.zero_copy is False
    assert np.array_equal(rebuilt.function(np.ones(4, np.float32))[0], np.ones(4, np.float32))


def test_the_input_check_runs_in_the_engine_and_main_stays_as_exported(int8_cnn):
    """A quantized cluster's float32 inputs are summed inside the module (CHECKED_ENTRY, called
    by the runner); `main`, what `qlower.export` runs, has the cluster's outputs only."""
    from qlower.backends.iree.tosa_emit import CHECKED_ENTRY
    cm, ref, cluster, entry = int8_cnn
    assert cluster.engine_sums and f"@{CHECKED_ENTRY}" in cluster.mlir
    (x,) = entry.inputs(2, seed=7)
    main = load_function(cluster.vmfb, cluster.driver)
    checked = load_function(cluster.vmfb, cluster.driver, CHECKED_ENTRY)
    (out,) = main(x.numpy())
    got, total = checked(x.numpy())
    assert np.array_equal(out, got) and np.array_equal(out, ref(x).numpy())
    assert total.shape == (1,) and total[0] == pytest.approx(float(x.double().sum()), rel=1e-5, abs=1e-3)


@pytest.mark.parametrize("zero_copy", [True, False])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_inputs_seen_by_the_engine_run_in_pytorch(int8_cnn, zero_copy, bad):
    cm, ref, cluster, entry = int8_cnn
    (x,) = entry.inputs(2, seed=8)
    x[1, 2, 3, 4] = bad
    before = cluster.info.nonfinite_calls or 0
    cluster.zero_copy = zero_copy
    try:
        with warnings.catch_warnings():   # the policy warns once per model (tests/test_bad_inputs.py)
            warnings.simplefilter("ignore", qlower.errors.NonFiniteInputWarning)
            got = cm(x)
    finally:
        cluster.zero_copy = True
    assert cluster.info.nonfinite_calls == before + 1
    assert torch.equal(got, cluster._pytorch((x,)))


def test_a_finite_input_whose_sum_overflows_is_not_called_nonfinite(int8_cnn):
    """float32 sums of finite values can overflow to inf: the exact check decides, and the call
    stays on IREE."""
    cm, ref, cluster, entry = int8_cnn
    x = torch.full((2, 3, 32, 32), 3e38)
    before = cluster.info.nonfinite_calls or 0
    assert torch.equal(cm(x), ref(x))
    assert (cluster.info.nonfinite_calls or 0) == before
