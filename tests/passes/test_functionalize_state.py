"""FunctionalizeState: in-place writes to module state become functional ops plus one write-back
per buffer (a private temporary's in-place op becomes functional, a graph input's stays); values
and state across calls equal eager's; idempotent; a pure graph is left alone."""
import torch

from qlower.passes import PassContext, PassManager


class Stateful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 3))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x, pos, bias):
        self.cache.index_copy_(0, pos, x)        # state write, read below
        y = self.cache * 2
        self.steps.add_(1)
        t = y.sum(0)
        t.add_(1)                                # a private temporary
        bias.add_(1)                             # a graph input: must stay in place
        return y + t + self.steps


def _state_passes(gm):
    from qlower.passes import FunctionalizeState
    return PassManager([FunctionalizeState()]).run(gm, PassContext())


def test_functionalize_state_makes_writes_functional_with_one_write_back_each():
    from qlower.passes.functionalize_state import WRITE_BACK
    eager = Stateful()
    args = lambda i: (torch.full((1, 3), float(i)), torch.tensor([i % 4]), torch.zeros(3))
    gm = torch.export.export(Stateful(), args(0)).module()
    ctx = _state_passes(gm)
    assert ctx.rewrites
    mutating = [n for n in gm.graph.nodes if n.op == "call_function" and n.target._schema.is_mutable]
    write_backs = [n for n in mutating if n.meta.get(WRITE_BACK)]
    assert len(write_backs) == 2  # cache, steps: one write each, at the end
    assert [n.target for n in mutating if not n.meta.get(WRITE_BACK)] == [torch.ops.aten.add_.Tensor]  # the input
    for i in range(5):  # numerics and state across calls equal eager
        a, b = args(i), args(i)
        assert torch.equal(gm(*a), eager(*b)) and torch.equal(a[2], b[2])
    assert torch.equal(gm.cache, eager.cache) and torch.equal(gm.steps, eager.steps)
    assert not _state_passes(gm).rewrites  # idempotent


def test_functionalize_state_leaves_pure_graphs_alone():
    gm = torch.export.export(torch.nn.Linear(3, 3), (torch.randn(1, 3),)).module()
    before = [n.target for n in gm.graph.nodes]
    assert not _state_passes(gm).rewrites
    assert [n.target for n in gm.graph.nodes] == before
