"""direct_forms.rename_to_direct_forms: `to` and the bitwise operator aliases renamed before
translation, so such clusters are not re-traced whole (backends/onnxruntime/direct_forms.py)."""
import pytest
import torch

import qlower
from qlower.backends.onnxruntime.direct_forms import rename_to_direct_forms

aten = torch.ops.aten


class MaskArithmetic(torch.nn.Module):
    """What HuggingFace's mask code brings into a cluster: `to` of several forms and `&`."""

    def forward(self, x, mask):
        keep = (mask > 0).to(torch.bool) & (x > -1.0).to(x.device)
        y = torch.where(keep, x, 0.0).to(device="cpu", dtype=torch.float64)
        return y.to(dtype=torch.float32) + (keep ^ True).to(x.dtype)


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 8, generator=g), torch.randint(0, 2, (2, 8), generator=g)


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_to_and_bitwise_aliases_are_renamed_with_the_same_values():
    args = _inputs()
    ep = torch.export.export(MaskArithmetic(), args)
    before = ep.module()(*args)
    assert {aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.__and__.Tensor, aten.__xor__.Scalar} <= set(_targets(ep.graph_module))
    renamed = rename_to_direct_forms(ep.graph_module)
    targets = _targets(ep.graph_module)
    assert renamed >= 5
    assert not {aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.__and__.Tensor, aten.__xor__.Scalar} & set(targets)
    assert aten._to_copy.default in targets and aten.bitwise_and.Tensor in targets
    after = ep.module()(*args)
    assert after.dtype == before.dtype and torch.equal(after, before)
    assert rename_to_direct_forms(ep.graph_module) == 0   # idempotent


class AliasThenInPlace(torch.nn.Module):
    """`to` to the same dtype returns its input itself: the in-place add changes x too."""

    def forward(self, x):
        y = x.to(torch.float32)
        y.add_(1.0)
        return x * 2


class ChannelsLast(torch.nn.Module):
    def forward(self, x):
        return x.to(torch.float32, memory_format=torch.channels_last) + 1


@pytest.mark.parametrize("module, x", [(AliasThenInPlace(), torch.randn(2, 3)),
                                       (ChannelsLast(), torch.randn(1, 3, 4, 4, dtype=torch.float64))],
                         ids=["in-place-op-in-the-graph", "memory-format"])
def test_near_misses_keep_their_to(module, x):
    ep = torch.export.export(module, (x,))
    to_nodes = [t for t in _targets(ep.graph_module) if t in (aten.to.dtype, aten.to.dtype_layout)]
    if not to_nodes:
        pytest.skip("torch.export already removed the `to` here")   # pragma: no cover (torch 2.13 keeps it)
    assert rename_to_direct_forms(ep.graph_module) == 0
    assert [t for t in _targets(ep.graph_module) if t in (aten.to.dtype, aten.to.dtype_layout)] == to_nodes


def test_a_mask_cluster_is_translated_without_a_re_trace_and_answers_as_eager(monkeypatch):
    calls = []
    original = torch.export.ExportedProgram.run_decompositions

    def counting(self, *a, **k):
        calls.append(1)
        return original(self, *a, **k)
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", counting)
    model, args = MaskArithmetic(), _inputs()
    cm = qlower.compile(model, args, backend="onnxruntime")
    report = cm.report()
    assert report.fallbacks == [] and [c.backend for c in report.compiled] == ["onnxruntime"]
    assert calls == []
    for seed in range(3):
        g = torch.Generator().manual_seed(seed + 10)
        x, mask = torch.randn(2, 8, generator=g), torch.randint(0, 2, (2, 8), generator=g)
        assert torch.equal(cm(x, mask), model(x, mask))


def test_the_in_place_graph_still_answers_as_eager():
    model, x = AliasThenInPlace(), torch.randn(2, 3)
    cm = qlower.compile(model, (x,), backend="onnxruntime")
    assert torch.equal(cm(x.clone()), model(x.clone()))
