"""FoldQuantizedConstants: shape ops on a quantized constant are evaluated at compile time with
their QParams re-derived (positive, the dequantized weights bit-identical, tied weights kept
tied, idempotent); split / unbind give each piece its slice of the qparams; merging the channel
dimension is refused with its reason, and arithmetic on a quantized constant is never folded
(near misses)."""
import pytest
import torch
import torch.nn.functional as F

from qlower.meta import QPARAMS_KEY
from qlower.passes import AttachQParams, FoldQuantizedConstants, PassContext, PassManager

from qdq_models import WeightChain, folded, graph_module

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


def consumer_inputs(gm, x, target=aten.matmul.default):
    """The tensors a consumer op actually receives when gm runs on x."""
    seen = []

    class Spy(torch.fx.Interpreter):
        def run_node(self, n):
            if n.target == target:
                seen.append([a.clone() for a in self.map_nodes_to_values(n.args, n)])
            return super().run_node(n)
    Spy(gm).run(x)
    return seen


def same_weights_reach_consumer(a, b, x):
    """Folding moves integers only: the dequantized weights the matmul sees are bit-identical,
    whatever their memory layout (the float matmul's rounding may follow the layout)."""
    wa = [args[1].contiguous() for args in consumer_inputs(a, x)]
    wb = [args[1].contiguous() for args in consumer_inputs(b, x)]
    return len(wa) == len(wb) > 0 and all(torch.equal(p, q) for p, q in zip(wa, wb))


@pytest.mark.parametrize("op,shape_ops_left", [
    (lambda w: w.t().t(), 0), (lambda w: w.permute(1, 0).permute(1, 0), 0), (lambda w: w.reshape(8, 6), 0),
    (lambda w: w.flip(1).flip(1), 0), (lambda w: w.unsqueeze(0).squeeze(0), 0),
])
def test_fold_positive_bit_identical(op, shape_ops_left):
    x = torch.randn(3, 8)
    model = WeightChain(op)
    gm, ctx = folded(model, x)
    shape_targets = {aten.t.default, aten.permute.default, aten.reshape.default, aten.view.default,
                     aten.flip.default, aten.unsqueeze.default, aten.squeeze.dim}
    assert sum(n.target in shape_targets for n in gm.graph.nodes) == shape_ops_left
    dq = [n for n in gm.graph.nodes if n.target == qd.dequantize_per_channel.default]
    assert len(dq) == 1 and dq[0].meta[QPARAMS_KEY].axis == 1
    assert same_weights_reach_consumer(gm, graph_module(model, x), x)


def test_fold_refuses_channel_merge_and_records_reason():
    x = torch.randn(3, 48)
    model = WeightChain(lambda w: w.reshape(48, 1))
    gm, ctx = folded(model, x)
    assert any("merges the channel dimension 1" in r.reason for r in ctx.refusals)
    assert any(n.target == aten.reshape.default for n in gm.graph.nodes)


def test_fold_is_idempotent_and_keeps_tied_weights_tied():
    x = torch.randn(3, 6)
    model = WeightChain(lambda w: w.t(), tie=True)
    gm, ctx = folded(model, x)
    consts = [n for n in gm.graph.nodes if n.op == "get_attr" and "folded" in str(n.target)]
    assert len(consts) == 2 and len({str(n.target) for n in consts}) == 1  # one shared buffer
    before = str(gm.graph)
    assert not FoldQuantizedConstants().run(gm, PassContext())
    assert str(gm.graph) == before
    assert same_weights_reach_consumer(gm, graph_module(model, x), x)


class SplitWeights(torch.nn.Module):
    """A fused [3N, K] weight split into q/k/v pieces (per-channel on the split axis 0)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("w", torch.randint(-127, 128, (12, 5), generator=g).to(torch.int8))
        self.register_buffer("s", torch.rand(12, generator=g) * 0.01 + 0.001)
        self.register_buffer("z", torch.zeros(12, dtype=torch.int64))

    def forward(self, x):
        wd = qd.dequantize_per_channel(self.w, self.s, self.z, 0, -127, 127, torch.int8)
        a, b, c = wd.split(4, 0)
        return F.linear(x, a) + F.linear(x, b) * F.linear(x, c)


def test_fold_split_gives_each_piece_its_channel_qparams():
    x = torch.randn(3, 5)
    model = SplitWeights()
    gm, ctx = folded(model, x)
    assert not any(n.target == aten.split.Tensor for n in gm.graph.nodes)
    dqs = [n for n in gm.graph.nodes if n.target == qd.dequantize_per_channel.default]
    assert [dq.meta[QPARAMS_KEY].scale for dq in dqs] == [tuple(model.s[i:i + 4].tolist()) for i in (0, 4, 8)]
    assert torch.equal(gm(x), graph_module(model, x)(x))


class UnbindWeights(torch.nn.Module):
    def __init__(self, axis):
        super().__init__()
        self.axis = axis
        self.w = torch.randint(-127, 128, (3, 4, 5), dtype=torch.int8)
        n = self.w.shape[axis]
        self.s = torch.linspace(0.01, 0.05, n)
        self.z = torch.zeros(n, dtype=torch.int64)

    def forward(self, x):
        wd = qd.dequantize_per_channel(self.w, self.s, self.z, self.axis, -127, 127, torch.int8)
        a, b, c = wd.unbind(0)
        return F.linear(x, a) + F.linear(x, b) - F.linear(x, c)


@pytest.mark.parametrize("axis", [0, 1])
def test_fold_unbind_of_quantized_constant(axis):
    """unbind along the channel axis leaves one channel (per-tensor) per piece; along another
    axis the channel axis shifts down by one."""
    x = torch.randn(2, 5)
    model = UnbindWeights(axis)
    gm, ctx = folded(model, x)
    assert not any(n.target == aten.unbind.int for n in gm.graph.nodes)
    pieces = [n.meta[QPARAMS_KEY] for n in gm.graph.nodes if QPARAMS_KEY in n.meta and n.args
              and "folded" in str(getattr(n.args[0], "target", ""))]
    if axis == 0:
        assert [p.axis for p in pieces] == [None] * 3 and [p.scale[0] for p in pieces] == model.s.tolist()
    else:
        assert all(p.axis == 0 and p.scale == tuple(model.s.tolist()) for p in pieces)
    assert torch.equal(gm(x), graph_module(model, x)(x))


def test_fold_leaves_arithmetic_on_a_quantized_constant():
    x = torch.randn(3, 8)
    gm = graph_module(WeightChain(lambda w: w * 2), x)
    want = gm(x)
    PassManager([AttachQParams()]).run(gm)
    before = str(gm.graph)
    assert not FoldQuantizedConstants().run(gm, PassContext())
    assert str(gm.graph) == before and torch.equal(gm(x), want)
