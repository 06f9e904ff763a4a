"""direct_forms.rename_to_direct_forms: `to` and the bitwise operator aliases renamed before
translation, so such clusters are not re-traced whole (onnx/direct_forms.py)."""
import pytest
import torch

import qlower
from qlower.onnx.direct_forms import rename_to_direct_forms

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
    assert {aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.__and__.Tensor,
            aten.__xor__.Scalar} <= set(_targets(ep.graph_module))
    renamed = rename_to_direct_forms(ep.graph_module)
    targets = _targets(ep.graph_module)
    assert renamed >= 5
    assert not {aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.__and__.Tensor,
                aten.__xor__.Scalar} & set(targets)
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
    assert to_nodes, "torch.export kept no `to` here: the near miss tests nothing"
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


@pytest.mark.slow
def test_the_in_place_graph_still_answers_as_eager():
    model, x = AliasThenInPlace(), torch.randn(2, 3)
    cm = qlower.compile(model, (x,), backend="onnxruntime")
    assert torch.equal(cm(x.clone()), model(x.clone()))


class ConvBnPool(torch.nn.Module):
    """Eval-mode batch norm and global average pooling: what every zoo CNN's fp32 cluster holds."""

    def __init__(self, pooled=1):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)
        self.pooled = pooled
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.bn(self.conv(x))), self.pooled)


def _calls(gm):
    return [str(t) for t in _targets(gm) if t not in (aten._assert_tensor_metadata.default,)]


def test_batch_norm_and_global_pooling_become_what_torch_onnx_decomposes_them_into():
    from qlower.onnx.translate import exporter_decompositions
    torch.manual_seed(0)
    module, x = ConvBnPool().eval(), torch.randn(2, 3, 8, 8)
    ours = torch.export.export(module, (x,))
    assert rename_to_direct_forms(ours.graph_module) == 2
    theirs = torch.export.export(module, (x,)).run_decompositions(exporter_decompositions())
    assert _calls(ours.graph_module) == _calls(theirs.graph_module)
    assert torch.equal(ours.module()(x), theirs.module()(x))
    assert rename_to_direct_forms(ours.graph_module) == 0


@pytest.mark.parametrize("make", [lambda: ConvBnPool().train(), lambda: ConvBnPool(pooled=2).eval()],
                         ids=["training-mode-batch-norm", "pooled-to-2x2"])
def test_near_misses_keep_batch_norm_or_pooling(make):
    module, x = make(), torch.randn(2, 3, 8, 8)
    ep = torch.export.export(module, (x,))
    before = _calls(ep.graph_module)
    rename_to_direct_forms(ep.graph_module)
    after = _calls(ep.graph_module)
    kept = "aten.batch_norm.default" if module.training else "aten.adaptive_avg_pool2d.default"
    assert kept in before and kept in after


def test_a_cnn_cluster_translates_to_the_same_answers_with_and_without_the_full_re_trace(monkeypatch):
    from qlower.backends import onnxruntime as ortb
    from qlower.onnx import translate
    calls = []
    original = torch.export.ExportedProgram.run_decompositions
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    torch.manual_seed(0)
    module, x = ConvBnPool().eval(), torch.randn(2, 3, 8, 8)
    fast = qlower.compile(module, (x,), backend="onnxruntime")
    assert calls == []
    monkeypatch.setattr(translate, "rename_to_direct_forms", lambda gm: 0)
    monkeypatch.setattr(ortb, "_SESSIONS", ortb.cache.LRUCache())   # translated again, not served from a cache
    monkeypatch.setattr(ortb, "_MODELS", ortb.cache.LRUCache())
    monkeypatch.setenv("QLOWER_CACHE_DIR", "off")
    slow = qlower.compile(module, (x,), backend="onnxruntime")
    assert calls == [1]
    for seed in range(3):
        xi = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(fast(xi), slow(xi))


def test_a_batch_norm_that_is_the_graph_output_keeps_its_name():
    """The ExportedProgram's signature names its outputs by node: the rewritten node keeps it
    (found by the OpInfo sample of nn.functional.batch_norm: torch.onnx raised KeyError)."""
    bn = torch.nn.BatchNorm1d(3).eval()
    module, x = torch.nn.Sequential(bn), torch.randn(4, 3)
    ep = torch.export.export(module, (x,))
    outputs = [spec.arg.name for spec in ep.graph_signature.output_specs]
    assert rename_to_direct_forms(ep.graph_module) == 1
    names = {n.name for n in ep.graph.nodes}
    assert set(outputs) <= names
    cm = qlower.compile(module, (x,), backend="onnxruntime")
    assert cm.report().fallbacks == []
    torch.testing.assert_close(cm(x), module(x))


class CacheWrite(torch.nn.Module):
    """A KV cache write as transformers' StaticCache makes it (functional: index_copy)."""

    def __init__(self, scalar_index=False):
        super().__init__()
        self.scalar_index = scalar_index
        self.register_buffer("k", torch.arange(3 * 16 * 4, dtype=torch.float32).reshape(1, 3, 16, 4))

    def forward(self, x, pos):
        if self.scalar_index:
            return torch.index_copy(self.k, 2, pos[0], x[:, :, :1]) * 2
        return torch.index_copy(self.k, -2, pos, x) * 2


def _cache_inputs(length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 3, length, 4, generator=g), torch.randperm(16, generator=g)[:length]


def test_index_copy_becomes_one_scatter_with_the_same_values():
    module, args = CacheWrite(), _cache_inputs(5)
    seq = torch.export.Dim("seq", min=1, max=16)
    ep = torch.export.export(module, args, dynamic_shapes=({2: seq}, {0: seq}))
    assert aten.index_copy.default in _targets(ep.graph_module)
    assert rename_to_direct_forms(ep.graph_module) == 1
    targets = _targets(ep.graph_module)
    assert aten.index_copy.default not in targets and aten.scatter.src in targets
    assert aten.sym_size.int in targets   # the symbolic length read, not a size fixed at 5
    for length in (1, 5, 16):
        x, pos = _cache_inputs(length, seed=length)
        assert torch.equal(ep.module()(x, pos), module(x, pos))
    assert rename_to_direct_forms(ep.graph_module) == 0


def test_a_scalar_index_copy_is_left_to_the_decomposition():
    module, args = CacheWrite(scalar_index=True), _cache_inputs(2)
    ep = torch.export.export(module, args)
    assert aten.index_copy.default in _targets(ep.graph_module)
    assert rename_to_direct_forms(ep.graph_module) == 0
    assert aten.index_copy.default in _targets(ep.graph_module)


def test_a_cache_write_cluster_is_one_scatter_without_a_re_trace(monkeypatch):
    import onnx

    from qlower.backends import onnxruntime as ortb
    calls = []
    original = torch.export.ExportedProgram.run_decompositions
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    monkeypatch.setattr(ortb, "_MODELS", ortb.cache.LRUCache())
    monkeypatch.setenv("QLOWER_CACHE_DIR", "off")
    module, seq = CacheWrite(), torch.export.Dim("seq", min=1, max=16)
    cm = qlower.compile(module, _cache_inputs(5), backend="onnxruntime", dynamic_shapes=({2: seq}, {0: seq}))
    assert calls == [] and cm.report().fallbacks == []
    ops = [n.op_type for model in ortb._MODELS.values() for n in onnx.load_from_string(model).graph.node]
    assert ops.count("ScatterElements") == 1 and "ScatterND" not in ops and "Transpose" not in ops
    for length in (1, 7, 16):
        x, pos = _cache_inputs(length, seed=length)
        assert torch.equal(cm(x, pos), module(x, pos))
