"""OuterProductsAsMul (iree legalization): a float matrix product with a reduction size of 1
becomes a broadcast mul (matmul, mm, linear with and without bias, addmm: positives, values
bit-exact without a bias, idempotence); a reduction of 2, a 1-D operand and an integer product
are left (near misses)."""
import torch

from qlower.passes import PassContext
from qlower.passes.iree.outer_products_as_mul import OuterProductsAsMul


def test_outer_products_pass_contract():
    """iree's legalization pass: positives (matmul, mm, linear with and without bias, addmm with a
    reduction size of 1), near misses (a reduction of 2; a 1-D operand; an integer product),
    idempotent, values unchanged (bit-exact without a bias: one product either way)."""
    from qlower.passes.iree.outer_products_as_mul import OuterProductsAsMul
    from qlower.passes import PassManager

    class Products(torch.nn.Module):
        def forward(self, x, w, b, v, i):
            return (x[:, 2:3] @ w, torch.mm(x[:, :1], w), torch.nn.functional.linear(x[:, 3:4], w.t()),
                    torch.nn.functional.linear(x[:, 3:4], w.t(), b), torch.addmm(b, x[:, 5:6], w),
                    x[:, :2] @ v, x[0, 2:3] @ w, i[:, :1] @ i[:1])
    args = (torch.randn(4, 12), torch.randn(1, 5), torch.randn(5), torch.randn(2, 5), torch.randint(-5, 5, (3, 3)))
    gm = torch.export.export(Products(), args).module()
    want = gm(*args)
    ctx = PassManager([OuterProductsAsMul()]).run(gm, PassContext())
    assert sum(ctx.rewrites.values()) == 5
    left = [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "matmul" in str(n.target)]
    assert len(left) == 3, left   # the K = 2 product, the 1-D operand, the integer product
    assert not OuterProductsAsMul().run(gm, PassContext())          # idempotent
    got = gm(*args)
    assert all(torch.equal(w, g) for w, g in zip(want[:3] + want[5:], got[:3] + got[5:]))
    assert all(torch.allclose(w, g, rtol=1e-6, atol=1e-6) for w, g in zip(want[3:5], got[3:5]))   # + bias


class _ProductsThatReduce(torch.nn.Module):
    def forward(self, x, w, v, i):
        return x[:, :2] @ v, x[0, 2:3] @ w, i[:, :1] @ i[:1], torch.addmm(v[0], x[:, 5:6], w, beta=2.0)


def test_outer_products_near_misses_stay():
    args = (torch.randn(4, 12), torch.randn(1, 5), torch.randn(2, 5), torch.randint(-5, 5, (3, 3)))
    gm = torch.export.export(_ProductsThatReduce(), args).module()
    before, want = str(gm.graph), gm(*args)
    assert not OuterProductsAsMul().run(gm, PassContext())
    assert str(gm.graph) == before and all(torch.equal(w, g) for w, g in zip(want, gm(*args)))
