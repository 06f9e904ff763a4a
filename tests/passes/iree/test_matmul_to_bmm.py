"""MatmulToBmm (iree legalization): a rank-3 x rank-3 aten.matmul with equal batches becomes
aten.bmm (positive, static or symbolic batch, values bit for bit, idempotence); a broadcast
batch, other ranks and bmm itself are left (near misses)."""
import torch

from qlower.passes import PassContext
from qlower.passes.iree.matmul_to_bmm import MatmulToBmm


def test_batched_matmuls_pass_contract():
    """Positive (rank-3 x rank-3, equal batch, static or symbolic), near misses (broadcast batch,
    rank-3 x rank-2, rank 4), values bit for bit, idempotence; a broadcast-batch one with a
    dynamic batch is refused alone in an int8 module with its reason."""
    from qlower.passes.iree.matmul_to_bmm import MatmulToBmm
    from qlower.backends.iree.torch_import import not_importable_alone
    from qlower.passes import PassContext, PassManager

    class Products(torch.nn.Module):
        def forward(self, a, b, c, w, d):
            return a @ b, c @ b, a @ w, d @ d.transpose(-1, -2)

    args = (torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(1, 3, 4), torch.randn(4, 5),
            torch.randn(2, 2, 3, 4))
    batch = torch.export.Dim("batch", min=1, max=8)
    gm = torch.export.export(Products(), args, dynamic_shapes=({0: batch}, {0: batch}, None, None, None)).module()
    want = gm(*args)
    ctx = PassManager([MatmulToBmm()]).run(gm, PassContext())
    assert sum(ctx.rewrites.values()) == 1
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in
             (torch.ops.aten.bmm.default, torch.ops.aten.matmul.default)]
    assert [n.target is torch.ops.aten.bmm.default for n in calls] == [True, False, False, False]
    assert all(torch.equal(g, w) for g, w in zip(gm(*args), want))
    assert not PassManager([MatmulToBmm()]).run(gm, PassContext()).rewrites   # idempotent
    broadcast = calls[1]   # [1, 3, 4] @ [B, 4, 5]
    assert "broadcasting a dynamic batch" in not_importable_alone(broadcast)
    assert not_importable_alone(calls[2]) is None


class _OtherProducts(torch.nn.Module):
    def forward(self, a, b, c, w):
        return c @ b, a @ w, torch.bmm(a, b)


def test_batched_matmuls_near_misses_stay():
    args = (torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(1, 3, 4), torch.randn(4, 5))
    gm = torch.export.export(_OtherProducts(), args).module()
    before, want = str(gm.graph), gm(*args)
    assert not MatmulToBmm().run(gm, PassContext())
    assert str(gm.graph) == before and all(torch.equal(w, g) for w, g in zip(want, gm(*args)))
