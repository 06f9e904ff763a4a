"""FoldFloatConstants: pure ops on float constants (and constant factories, int64 positions) are
evaluated once (positive, values as PyTorch computes them, idempotent); x-dependent ops,
quantized tensors, factories beyond 2^16 elements and an arange of a dynamic length are left
(near misses)."""
import torch

from qlower.passes import PassContext, PassManager

from qdq_models import WeightChain, graph_module

aten = torch.ops.aten


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
