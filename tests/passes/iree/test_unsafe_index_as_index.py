"""UnsafeIndexAsIndex (iree legalization): aten._unsafe_index becomes aten.index (positive,
values bit for bit, idempotence); index itself is left (near miss)."""
import torch

from qlower.passes import PassContext
from qlower.passes.iree.unsafe_index_as_index import UnsafeIndexAsIndex


def test_unsafe_index_pass_contract():
    """Positive (`_unsafe_index` → `index`), near miss (`index` already), values bit for bit,
    idempotence."""
    from qlower.passes.iree.unsafe_index_as_index import UnsafeIndexAsIndex
    from qlower.passes import PassContext, PassManager

    class Gathers(torch.nn.Module):
        def forward(self, x, i):
            return torch.ops.aten._unsafe_index.Tensor(x, [None, i]) + torch.ops.aten.index.Tensor(x, [i])

    x, i = torch.randn(4, 4), torch.tensor([3, 0, 2, 1])
    gm = torch.export.export(Gathers(), (x, i)).module()
    want = gm(x, i)
    ctx = PassManager([UnsafeIndexAsIndex()]).run(gm, PassContext())
    assert sum(ctx.rewrites.values()) == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten._unsafe_index.Tensor not in targets and targets.count(torch.ops.aten.index.Tensor) == 2
    assert torch.equal(gm(x, i), want)
    assert not PassManager([UnsafeIndexAsIndex()]).run(gm, PassContext()).rewrites   # idempotent
    # the rewritten gather is marked in range by construction: no eager bounds check is asked of it
    # (backends/argument_checks.py), while the user's own index is
    from qlower.backends.argument_checks import requirements
    from qlower.passes.iree.unsafe_index_as_index import UNCHECKED_INDEX
    index_nodes = [n for n in gm.graph.nodes if n.target is torch.ops.aten.index.Tensor]
    assert sorted(bool(n.meta.get(UNCHECKED_INDEX)) for n in index_nodes) == [False, True]
    assert sorted(len(requirements(n)) for n in index_nodes) == [0, 1]


class _IndexAlready(torch.nn.Module):
    def forward(self, x, i):
        return torch.ops.aten.index.Tensor(x, [None, i]) * 2


def test_unsafe_index_near_miss_stays():
    x, i = torch.randn(4, 4), torch.tensor([3, 0, 2, 1])
    gm = torch.export.export(_IndexAlready(), (x, i)).module()
    before, want = str(gm.graph), gm(x, i)
    assert not UnsafeIndexAsIndex().run(gm, PassContext())
    assert str(gm.graph) == before and torch.equal(gm(x, i), want)
