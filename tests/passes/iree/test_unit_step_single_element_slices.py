"""UnitStepSingleElementSlices (iree legalization): a strided slice taking one element is
written with step 1 (positive, idempotence, values unchanged); strided slices of two or more
elements and step-1 slices are left (near misses)."""
import torch

from qlower.passes import PassContext
from qlower.passes.iree.unit_step_single_element_slices import UnitStepSingleElementSlices


def test_unit_step_slices_pass_contract():
    """iree's legalization pass: positive (x[:, 0:1:2], one element), near misses (x[:, 0:3:2]
    takes two; a step-1 slice), idempotent, values unchanged."""
    from qlower.passes.iree.unit_step_single_element_slices import UnitStepSingleElementSlices
    from qlower.passes import PassManager

    class Slices(torch.nn.Module):
        def forward(self, a, b):
            return a[:, 0:1:2], b[:, 0:3:2], b[:, 1:2], b[:, 1:3:2], b[:, -2::5]
    a, b = torch.randn(1, 1, 10), torch.randn(1, 3, 10)
    gm = torch.export.export(Slices(), (a, b)).module()
    want = gm(a, b)
    ctx = PassManager([UnitStepSingleElementSlices()]).run(gm, PassContext())
    steps = [n.args[4] if len(n.args) > 4 else 1 for n in gm.graph.nodes
             if n.op == "call_function" and n.target is torch.ops.aten.slice.Tensor]
    # positives: one element with an end past it (1:3:2 is element 1; -2::5 is element 1)
    assert sorted(steps) == [1, 1, 1, 1, 2] and sum(ctx.rewrites.values()) == 3
    assert not UnitStepSingleElementSlices().run(gm, PassContext())          # idempotent
    got = gm(a, b)
    assert all(torch.equal(w, g) for w, g in zip(want, got))


class _SlicesOfSeveral(torch.nn.Module):
    def forward(self, b):
        return b[:, 0:3:2], b[:, 1:2], b[:, ::2]


def test_unit_step_slices_near_misses_stay():
    b = torch.randn(1, 3, 10)
    gm = torch.export.export(_SlicesOfSeveral(), (b,)).module()
    before, want = str(gm.graph), gm(b)
    assert not UnitStepSingleElementSlices().run(gm, PassContext())
    assert str(gm.graph) == before and all(torch.equal(w, g) for w, g in zip(want, gm(b)))
