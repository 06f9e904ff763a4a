"""FoldEmptyTensors: positive cases, near misses that must not fire, idempotence, and eager's
values before and after (NaN where eager gives NaN), on every backend."""
import pytest
import torch

import qlower
from qlower.passes import FoldEmptyTensors, PassContext, PassManager

from qdq_models import graph_module

aten = torch.ops.aten


class EmptyOps(torch.nn.Module):
    """A (4, 0) slice of a real input, an (M, 0) @ (0, N) product, a cat and a topk of nothing."""

    def forward(self, x, a, b):
        e = x[:, :0]
        values, indices = torch.topk(a, 0, dim=1)
        return e.var(1), e.sum(1) + x[:, 0], torch.mm(a, b), torch.cat([a, a], 1), values, indices, x.sum(1)


def _inputs():
    torch.manual_seed(0)
    return torch.randn(4, 6), torch.randn(3, 0), torch.randn(0, 5)


def _same(got, want) -> bool:
    """Same shapes and dtypes, NaN in the same places; values within float rounding (the one
    non-empty reduction, x.sum(1), runs in the engine's summation order)."""
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6, equal_nan=True)
    return True


def x_column(inputs):
    return inputs[0][:, 0]


def _calls(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_folds_ops_of_empty_tensors_and_keeps_eagers_values():
    model, inputs = EmptyOps(), _inputs()
    gm = graph_module(model, *inputs)
    want = model(*inputs)
    ctx = PassManager([FoldEmptyTensors()]).run(gm)
    calls = _calls(gm)
    for folded in (aten.var.correction, aten.mm.default, aten.cat.default, aten.topk.default):
        assert folded not in calls, folded
    assert sum(ctx.rewrites.values()) >= 5
    got = gm(*inputs)
    assert _same(got, want) and got[0].isnan().all() and torch.equal(got[2], torch.zeros(3, 5))
    assert torch.equal(got[1], x_column(inputs))   # sum of nothing + x[:, 0]: exactly x[:, 0]


def test_near_misses_stay():
    """Non-empty tensors, and an op with one empty and one non-empty input and a non-empty
    result (addmm with K = 0: its value depends on `self`), are not touched."""
    class Near(torch.nn.Module):
        def forward(self, x, a, b):
            return x.sum(1), torch.addmm(x[:3, :5], a, b, beta=2.0)

    model, inputs = Near(), _inputs()
    gm = graph_module(model, *inputs)
    assert not FoldEmptyTensors().run(gm, PassContext())
    assert aten.sum.dim_IntList in _calls(gm) and aten.addmm.default in _calls(gm)


def test_symbolic_sizes_are_not_folded():
    """A batch dim declared dynamic is not statically empty, whatever the example holds."""
    class Net(torch.nn.Module):
        def forward(self, x):
            return x[:, :0].sum(1) + x[:, 0]

    x = torch.randn(4, 6)
    ep = torch.export.export(Net(), (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    gm = ep.module()
    FoldEmptyTensors().run(gm, PassContext())
    out = [n for n in gm.graph.nodes if n.op == "output"][0]
    assert any(n.op == "call_function" for n in out.all_input_nodes)   # (batch,): still computed
    assert torch.equal(gm(torch.ones(7, 6)), torch.ones(7))


def test_idempotent():
    gm = graph_module(EmptyOps(), *_inputs())
    FoldEmptyTensors().run(gm, PassContext())
    gm.recompile()
    before = str(gm.graph)
    assert not FoldEmptyTensors().run(gm, PassContext())
    assert str(gm.graph) == before


@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "openvino", "iree"])
def test_compiled_models_give_eagers_results_with_nothing_left_for_the_engines(backend):
    if backend == "iree":
        pytest.importorskip("iree.compiler")
    if backend == "openvino":
        pytest.importorskip("openvino")
    model, inputs = EmptyOps(), _inputs()
    cm = qlower.compile(model, inputs, backend=backend)
    assert _same(cm(*inputs), model(*inputs))
    assert not cm.report().fallbacks
