"""MergeReductionDims (iree legalization): a float sum / mean over several dims becomes one over a
merged dim (positive, permuted first when the dims are not trailing, values within float
rounding, idempotence); one reduced dim, symbolic shapes and integer inputs are left (near
misses)."""
import torch

_W5 = torch.rand(5, generator=torch.Generator().manual_seed(0)) + 0.5


class _OneOp(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def test_single_dim_reductions_pass_contract():
    """Positive (several dims, permuted when not trailing), near misses (one dim, symbolic
    shapes, integer input), values, idempotence."""
    from qlower.passes.iree.merge_reduction_dims import MergeReductionDims
    from qlower.passes import PassContext, PassManager

    def run(fn, x, dynamic_shapes=None):
        gm = torch.export.export(_OneOp(fn), (x,), dynamic_shapes=dynamic_shapes).module()
        want = gm(x)
        ctx = PassManager([MergeReductionDims()]).run(gm, PassContext())
        torch.testing.assert_close(gm(x), want, rtol=1e-6, atol=1e-6)
        again = PassManager([MergeReductionDims()]).run(gm, PassContext())
        assert not again.rewrites   # idempotent
        return sum(ctx.rewrites.values()), {n.target for n in gm.graph.nodes}
    x = torch.randn(2, 5, 6, 5)
    n, targets = run(lambda t: (t * _W5).sum((1, 3), keepdim=True), x)
    assert n == 1 and torch.ops.aten.permute.default in targets
    n, targets = run(lambda t: t.mean((2, 3)), x)
    assert n == 1 and torch.ops.aten.permute.default not in targets   # trailing: a reshape only
    assert run(lambda t: t.mean(3), x)[0] == 0                                        # one dim
    assert run(lambda t: t.mean((1, 2)), x, ({0: torch.export.Dim("b", min=2, max=8)},))[0] == 0   # symbolic
    assert run(lambda t: t.to(torch.int64).sum((1, 2)), x)[0] == 0                    # integers
