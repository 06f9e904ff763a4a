"""ScatterIntoNeutral (shared legalization) and the accumulating scatters on every backend:
without the pass, scatter_reduce "mean" is silently wrong on ONNX Runtime, OpenVINO and IREE, and
IREE loses repeated indices of every scatter accumulating into its input."""
import pytest
import torch

import qlower
from qlower.passes.scatter_into_neutral import ScatterIntoNeutral
from qlower.passes import PassContext

from conftest import Fn

aten = torch.ops.aten
REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, generator=g)
    src = torch.randn(4, 5, generator=g)
    if not dtype.is_floating_point:
        x, src = (x * 10).to(dtype), (src * 10).to(dtype)
    # repeats in every column
    index = torch.tensor([[0, 1, 0, 3, 0], [0, 1, 2, 3, 0], [2, 1, 0, 0, 0], [0, 0, 0, 3, 0]])
    return x, index, src


def _scatters(gm):
    return [(n.args[4], n.kwargs.get("include_self", True)) for n in gm.graph.nodes
            if n.target is aten.scatter_reduce.two]


@pytest.mark.parametrize("include_self", [True, False])
def test_mean_is_written_as_sums_into_zeros(include_self):
    x, index, src = _inputs()
    fn = lambda x, i, s: torch.scatter_reduce(x, 0, i, s, "mean", include_self=include_self)   # noqa: E731
    gm = torch.export.export(Fn(fn), (x, index, src)).module()
    assert ScatterIntoNeutral(frozenset({"mean"})).run(gm, PassContext())
    assert _scatters(gm) == [("sum", False), ("sum", False)]
    torch.testing.assert_close(gm(x, index, src), fn(x, index, src))
    before = str(gm.graph)
    assert not ScatterIntoNeutral().run(gm, PassContext()) and str(gm.graph) == before   # idempotent


def test_near_misses_stay():
    """include_self=False sums and products, amax/amin, and (when only "mean" is asked for) an
    include_self sum stay as they are."""
    x, index, src = _inputs()
    fn = lambda x, i, s: (torch.scatter_reduce(x, 0, i, s, "sum", include_self=False)   # noqa: E731
                          + torch.scatter_reduce(x, 0, i, s, "prod", include_self=False)
                          + torch.scatter_reduce(x, 0, i, s, "amax") + torch.scatter_reduce(x, 0, i, s, "sum"))
    gm = torch.export.export(Fn(fn), (x, index, src)).module()
    assert not ScatterIntoNeutral(frozenset({"mean"})).run(gm, PassContext())
    assert ScatterIntoNeutral().run(gm, PassContext())   # all: the include_self sum is written out
    assert ("sum", True) not in _scatters(gm)
    torch.testing.assert_close(gm(x, index, src), fn(x, index, src))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "openvino",
                                     pytest.param("iree", marks=pytest.mark.slow)])   # ~18 s a case
def test_accumulating_scatters_give_eagers_values_on_every_backend(backend, dtype):
    if backend == "iree":
        pytest.importorskip("iree.compiler")
    if backend == "openvino":
        pytest.importorskip("openvino")
    x, index, src = _inputs(dtype)
    for reduce in REDUCTIONS:
        for include_self in (True, False):
            fn = lambda x, i, s: torch.scatter_reduce(x, 0, i, s, reduce, include_self=include_self)   # noqa: E731
            cm = qlower.compile(Fn(fn), (x, index, src), backend=backend)
            torch.testing.assert_close(cm(x, index, src), fn(x, index, src), msg=f"{reduce} {include_self}")
    for fn in (lambda x, i, s: torch.scatter_add(x, 0, i, s),
               lambda x, i, s: x.index_put((i[:, 0],), s, accumulate=True)):
        cm = qlower.compile(Fn(fn), (x, index, src), backend=backend)
        torch.testing.assert_close(cm(x, index, src), fn(x, index, src))
