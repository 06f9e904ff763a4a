"""Quantization-aware folding: the shared axis helper, FoldQuantizedConstants,
PropagateDequantize, and the end-to-end TICO #499 patterns."""
import pytest
import torch
import torch.nn.functional as F

import qlower
from qlower.axis import derive, derive_concat, derive_split
from qlower.meta import QPARAMS_KEY, QParams
from qlower.passes import (AttachQParams, FoldQuantizedConstants, PassContext, PassManager,
                           PropagateDequantize, default_pipeline)
from qlower.fx import constant_value

from conftest import calib
from qdq_models import graph_module

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


def pc(n, axis, dtype=torch.int8):
    return QParams(tuple(float(i + 1) for i in range(n)), (0,) * n, -127, 127, dtype, axis)


PT = QParams((0.5,), (3,), -128, 127, torch.int8, None)


# ---------------------------------------------------------------- the shared helper
@pytest.mark.parametrize("target,args,shape,qp,axis", [
    (aten.permute.default, ([1, 2, 0],), (3, 4, 5), pc(3, 0), 2),
    (aten.permute.default, ([2, 0, 1],), (3, 4, 5), pc(5, 2), 0),
    (aten.transpose.int, (0, 1), (3, 4), pc(3, 0), 1),
    (aten.t.default, (), (3, 4), pc(4, 1), 0),
    (aten.reshape.default, ([3, 20],), (3, 4, 5), pc(3, 0), 0),
    (aten.reshape.default, ([1, 3, 1, 20],), (3, 4, 5), pc(3, 0), 1),
    (aten.view.default, ([2, 4, 5, 1],), (2, 4, 5), pc(4, 1), 1),
    (aten.flatten.using_ints, (1, -1), (3, 4, 5), pc(3, 0), 0),
    (aten.unflatten.int, (1, [2, 2]), (3, 4), pc(3, 0), 0),
    (aten.unsqueeze.default, (0,), (3, 4), pc(3, 0), 1),
    (aten.unsqueeze.default, (-1,), (3, 4), pc(4, 1), 1),
    (aten.squeeze.dim, (1,), (3, 1, 4), pc(4, 2), 1),
    (aten.expand.default, ([2, 3, 4],), (3, 4), pc(3, 0), 1),
    (aten.repeat.default, ([2, 1, 1],), (3, 4), pc(3, 0), 1),
])
def test_axis_moves(target, args, shape, qp, axis):
    out = derive(target, args, shape, qp)
    assert isinstance(out, QParams) and out.axis == axis and out.scale == qp.scale


@pytest.mark.parametrize("target,args,shape,qp,reason", [
    (aten.reshape.default, ([12, 5],), (3, 4, 5), pc(3, 0), "merges"),
    (aten.reshape.default, ([2, 2, 2, 5],), (2, 4, 5), pc(4, 1), "splits"),
    (aten.flatten.using_ints, (0, 1), (3, 4, 5), pc(3, 0), "merges"),
    (aten.expand.default, ([2, 4, 5],), (2, 1, 5), pc(1, 1), "broadcasts"),
    (aten.repeat.default, ([1, 2, 1],), (2, 4, 5), pc(4, 1), "replicates"),
    (aten.squeeze.dim, (0,), (1, 4), QParams((1.0,), (0,), -127, 127, torch.int8, 0), None),
])
def test_near_misses_refuse(target, args, shape, qp, reason):
    out = derive(target, args, shape, qp)
    if reason is None:  # squeezing a 1-channel axis is allowed: it becomes per-tensor
        assert isinstance(out, QParams) and not out.per_channel
    else:
        assert isinstance(out, str) and reason in out


def test_slicing_ops_slice_qparams():
    qp = pc(6, 1)
    assert derive(aten.slice.Tensor, (1, 1, 5, 2), (2, 6), qp).scale == (2.0, 4.0)
    assert derive(aten.narrow.default, (1, 2, 3), (2, 6), qp).scale == (3.0, 4.0, 5.0)
    sel = derive(aten.select.int, (1, 4), (2, 6), qp)
    assert not sel.per_channel and sel.scale == (5.0,)
    assert derive(aten.select.int, (0, 1), (2, 6), qp).axis == 0
    assert derive(aten.index_select.default, (1, torch.tensor([5, 0])), (2, 6), qp).scale == (6.0, 1.0)
    assert derive(aten.flip.default, ([1],), (2, 6), qp).scale == (6.0, 5.0, 4.0, 3.0, 2.0, 1.0)
    assert derive(aten.slice.Tensor, (0, 0, 1), (2, 6), qp) == qp


def test_per_tensor_passes_through_everything():
    for target, args in [(aten.reshape.default, ([12],)), (aten.permute.default, ([1, 0],)),
                         (aten.expand.default, ([2, 3, 4],))]:
        assert derive(target, args, (3, 4), PT) == PT


def test_concat_and_split():
    a, b = pc(2, 0), QParams((7.0, 8.0, 9.0), (0, 0, 0), -127, 127, torch.int8, 0)
    cat = derive_concat([a, b], 0, [(2, 4), (3, 4)])
    assert cat.scale == (1.0, 2.0, 7.0, 8.0, 9.0)
    assert isinstance(derive_concat([a, b], 1, [(2, 4), (3, 4)]), str)
    assert derive_concat([PT, PT], 1, [(2, 4), (2, 4)]) == PT
    assert [q.scale for q in derive_split(cat, 0, [2, 3], 2)] == [a.scale, b.scale]
    assert derive(aten.add.Tensor, (), (3,), PT) == "add.Tensor is not a shape-only op"


# ---------------------------------------------------------------- the passes
class WeightChain(torch.nn.Module):
    """int8 weight stored [K, N], dequantized per-channel along N (axis 1), then a shape op."""

    def __init__(self, op, tie=False):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("w", torch.randint(-127, 128, (8, 6), generator=g).to(torch.int8))
        self.register_buffer("s", torch.rand(6, generator=g) * 0.01 + 0.001)
        self.register_buffer("z", torch.zeros(6, dtype=torch.int64))
        self.op, self.tie = op, tie

    def forward(self, x):
        wd = qd.dequantize_per_channel(self.w, self.s, self.z, 1, -127, 127, torch.int8)
        if self.tie:
            return x @ self.op(wd) + (x @ self.op(wd)).relu()
        return x @ self.op(wd)


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


def folded(model, x, passes=None):
    gm = graph_module(model, x)
    ctx = PassManager(passes or [AttachQParams(), FoldQuantizedConstants()]).run(gm)
    return gm, ctx


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


class ActivationReshape(torch.nn.Module):
    def forward(self, x):
        q = qd.quantize_per_tensor(x, 0.05, 128, 0, 255, torch.uint8)
        d = qd.dequantize_per_tensor(q, 0.05, 128, 0, 255, torch.uint8)
        return d.reshape(2, -1).permute(1, 0)


def test_propagate_dequantize_moves_dq_below_shape_ops():
    x = torch.randn(2, 3, 4)
    gm, ctx = folded(ActivationReshape(), x, [AttachQParams(), PropagateDequantize()])
    order = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert order[-1] == qd.dequantize_per_tensor.default  # the DQ is now last
    assert order.index(aten.reshape.default) < order.index(qd.dequantize_per_tensor.default)
    assert torch.equal(gm(x), graph_module(ActivationReshape(), x)(x))
    assert not PropagateDequantize().run(gm, PassContext())


# ---------------------------------------------------------------- end to end (TICO #499)
class Decomposed(torch.nn.Module):
    """conv1d, a linear written as x @ w.t(), and a depthwise conv whose weight is stored HWIO
    and permuted in forward, after a permute-based layout change of the activation."""

    def __init__(self):
        super().__init__()
        self.conv1d = torch.nn.Conv1d(4, 8, 3, padding=1)
        self.w = torch.nn.Parameter(torch.randn(16, 8 * 6) * 0.1)
        self.dw_hwio = torch.nn.Parameter(torch.randn(3, 3, 1, 16) * 0.3)

    def forward(self, x):                               # x: [N, 4, 6]
        y = torch.relu(self.conv1d(x))                  # [N, 8, 6]
        y = y.flatten(1) @ self.w.t()                   # [N, 16]
        img = y.reshape(-1, 4, 4, 1).expand(-1, 4, 4, 16)  # NHWC
        img = img.permute(0, 3, 1, 2)                   # NCHW
        return F.conv2d(img, self.dw_hwio.permute(3, 2, 0, 1), padding=1, groups=16)


def test_end_to_end_decomposed_model_folds_and_lowers():
    torch.manual_seed(0)
    model = Decomposed().eval()
    x = torch.randn(2, 4, 6)
    ep = qlower.quantize(model, (x,), calib((2, 4, 6)))
    unfolded = ep.module()
    gm = ep.module()
    ctx = PassManager(default_pipeline()).run(gm)
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    for integer_op in (torch.ops.qlower.conv1d.default, torch.ops.qlower.linear.default,
                       torch.ops.qlower.conv2d.default):
        assert integer_op in ops, ctx.refusals
    # every weight reaches its integer op as a folded int8 constant, per-channel on axis 0
    for node in gm.graph.nodes:
        if node.target in (torch.ops.qlower.linear.default, torch.ops.qlower.conv2d.default):
            w = node.args[2]
            assert w.op == "get_attr" and constant_value(gm, w).dtype == torch.int8
            assert len(node.meta[QPARAMS_KEY].scale) == constant_value(gm, w).shape[0]
    # folding alone is value-preserving: folded Q/DQ graph == unfolded Q/DQ graph bit-exactly
    only_folded = ep.module()
    PassManager([AttachQParams(), FoldQuantizedConstants(), PropagateDequantize()]).run(only_folded)
    assert not any(n.target in (aten.t.default, aten.permute.default) and n.args[0].op == "call_function"
                   and n.args[0].target == qd.dequantize_per_channel.default for n in only_folded.graph.nodes)
    for seed in range(4):
        xs = calib((2, 4, 6), n=1, seed=seed)[0]
        assert torch.equal(only_folded(*xs), unfolded(*xs))
    assert qlower.report.sqnr_db(model(x), gm(x)) > 20


class FloatConstChain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(6, 4))
        self.register_buffer("noise_free", torch.ones(6))

    def forward(self, x):
        w = self.w.t() * 0.5 + self.noise_free  # all-constant arithmetic: folds
        return x @ w.t() + x.sum()             # x-dependent: stays


def test_fold_float_constants_positive_near_miss_idempotent():
    from qlower.passes import FoldFloatConstants
    torch.manual_seed(0)
    m = FloatConstChain().eval()
    x = torch.randn(3, 6)
    gm = graph_module(m, x)
    ctx = PassManager([FoldFloatConstants()]).run(gm)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert aten.mul.Tensor not in targets and aten.t.default not in targets  # whole weight chain folded
    assert aten.sum.default in targets  # near miss: x-dependent ops stay
    assert ctx.rewrites and torch.equal(gm(x), m(x))
    before = str(gm.graph)
    assert not FoldFloatConstants().run(gm, PassContext())
    assert str(gm.graph) == before


def test_fold_float_constants_never_touches_quantized_tensors():
    from qlower.passes import FoldFloatConstants
    gm = graph_module(WeightChain(lambda w: w.t()), torch.randn(3, 6))
    assert not FoldFloatConstants().run(gm, PassContext())  # int8 constant -> DQ: not its business


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


class ActivationUnbind(torch.nn.Module):
    def forward(self, x):
        q = qd.quantize_per_tensor(x, 0.05, 128, 0, 255, torch.uint8)
        d = qd.dequantize_per_tensor(q, 0.05, 128, 0, 255, torch.uint8)
        a, b, c = d.unbind(1)
        return a + b * c


class ActivationUnbindNearMiss(torch.nn.Module):
    """unbind of a float tensor that was never quantized: nothing to move."""
    def forward(self, x):
        a, b = x.unbind(0)
        return a * b


def test_propagate_dequantize_moves_dq_below_unbind():
    x = torch.randn(2, 3, 4)
    gm, ctx = folded(ActivationUnbind(), x, [AttachQParams(), PropagateDequantize()])
    unbind = next(n for n in gm.graph.nodes if n.target == aten.unbind.int)
    assert unbind.args[0].target == qd.quantize_per_tensor.default  # runs on the integers
    pieces = [n for n in gm.graph.nodes if n.target == qd.dequantize_per_tensor.default]
    assert len(pieces) == 3 and all(p.meta[QPARAMS_KEY].scale == (0.05,) for p in pieces)
    assert torch.equal(gm(x), graph_module(ActivationUnbind(), x)(x))
    before = str(gm.graph)
    assert not PropagateDequantize().run(gm, PassContext())  # idempotent
    assert str(gm.graph) == before


def test_propagate_dequantize_leaves_float_unbind_alone():
    x = torch.randn(2, 5)
    gm, ctx = folded(ActivationUnbindNearMiss(), x, [AttachQParams(), PropagateDequantize()])
    assert not ctx.rewrites
    assert next(n for n in gm.graph.nodes if n.target == aten.unbind.int).args[0].op == "placeholder"


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


class RotaryTables(torch.nn.Module):
    """LLaMA's rotary tables: positions from arange, times a buffer of inverse frequencies, then
    cos and sin — all constant at a static sequence length."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 10000.0 ** (-torch.arange(0, 16, 2).float() / 16))

    def forward(self, x):
        positions = torch.arange(x.shape[1]).unsqueeze(0).float()
        angles = positions[..., None] * self.inv_freq
        emb = torch.cat([angles, angles], -1)
        return x * emb.cos() + x * emb.sin()


def test_fold_float_constants_folds_constant_factories_and_positions():
    """arange of a static length, the int64 positions and what follows become one constant per
    table; x's ops stay; values as PyTorch computes them; idempotent."""
    from qlower.passes import FoldFloatConstants
    model, x = RotaryTables(), torch.randn(2, 12, 16)
    gm = graph_module(model, x)
    ctx = PassManager([FoldFloatConstants()]).run(gm)
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert not targets & {aten.arange.default, aten.arange.start, aten.cos.default, aten.sin.default, aten.cat.default}
    assert targets - {aten._assert_tensor_metadata.default} == {aten.mul.Tensor, aten.add.Tensor}
    assert any("of constant arguments" in k for k in ctx.rewrites)
    assert torch.equal(gm(x), model(x))
    assert not FoldFloatConstants().run(gm, PassContext())


class BigFactory(torch.nn.Module):
    def forward(self, x):
        return x + torch.zeros(300, 300)


class SymbolicArange(RotaryTables):
    pass


def test_fold_float_constants_near_misses_for_factories():
    """A factory beyond 2^16 elements stays a call (no megabyte constants in the model files), and
    an arange of a dynamic length is not a constant."""
    from qlower.passes import FoldFloatConstants
    gm = graph_module(BigFactory(), torch.randn(300, 300))
    assert not FoldFloatConstants().run(gm, PassContext())
    seq = torch.export.Dim("seq", min=2, max=64)
    gm = torch.export.export(SymbolicArange(), (torch.randn(2, 12, 16),), dynamic_shapes={"x": {1: seq}}).module()
    PassManager([FoldFloatConstants()]).run(gm)
    assert any(n.target in (aten.arange.default, aten.arange.start) for n in gm.graph.nodes)
    x = torch.randn(2, 20, 16)
    assert torch.equal(gm(x), SymbolicArange()(x))
