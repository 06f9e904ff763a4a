"""DropNoopCeilMode (iree legalization): a 2-D pool whose ceil_mode=True changes nothing is
written with ceil_mode=False (positive, idempotence, values identical); a pool where ceil mode
adds a window, and ceil_mode=False pools, are left (near misses); the rule against PyTorch's own
output sizes."""
import torch

from qlower.passes import PassContext
from qlower.passes.iree.drop_noop_ceil_mode import DropNoopCeilMode


def test_drop_noop_ceil_mode_pass_contract():
    """iree's legalization pass: positive (8x8, k2 s2: no partial window), near miss (7x7: ceil
    mode adds a window, kept), idempotent, values unchanged."""
    from qlower.passes.iree.drop_noop_ceil_mode import DropNoopCeilMode
    from qlower.passes import PassManager

    class Pools(torch.nn.Module):
        def forward(self, a, b):
            return (torch.nn.functional.max_pool2d(a, 2, 2, ceil_mode=True),
                    torch.nn.functional.max_pool2d(b, 2, 2, ceil_mode=True))
    a, b = torch.randn(1, 2, 8, 8), torch.randn(1, 2, 7, 7)
    gm = torch.export.export(Pools(), (a, b)).module()
    want = gm(a, b)
    ctx = PassManager([DropNoopCeilMode()]).run(gm, PassContext())
    modes = [n.args[5] if len(n.args) > 5 else n.kwargs.get("ceil_mode") for n in gm.graph.nodes
             if n.op == "call_function" and "max_pool2d" in str(n.target)]
    assert modes == [False, True] and sum(ctx.rewrites.values()) == 1
    assert not DropNoopCeilMode().run(gm, PassContext())          # idempotent
    got = gm(a, b)
    assert all(torch.equal(w, g) for w, g in zip(want, got))


def test_ceil_mode_noop_rule_matches_pytorch_output_sizes():
    """drop_noop_ceil_mode's rule (ceil_mode=True changes nothing) against PyTorch's own output
    sizes, over pools where ceil mode does and does not matter; the rewrite then flips exactly
    the no-op ones (torch-mlir mis-sizes those, docs/iree.md)."""
    from qlower.pool_geometry import ceil_mode_is_noop, drop_noop_ceil_mode

    class Pools(torch.nn.Module):
        def __init__(self, k, s, p, d):
            super().__init__()
            self.cfg = (k, s, p, d)

        def forward(self, x):
            k, s, p, d = self.cfg
            return (torch.nn.functional.max_pool2d(x, k, s, p, d, ceil_mode=True),
                    torch.nn.functional.avg_pool2d(x, k, s, p, ceil_mode=True))
    seen = set()
    for n, k, s, p, d in [(3, 3, 3, 0, 1), (3, 2, 3, 0, 1), (5, 3, 2, 1, 1), (6, 3, 2, 1, 1), (7, 2, 3, 1, 1),
                          (9, 3, 2, 0, 2), (4, 1, 1, 0, 1), (8, 3, 3, 1, 1)]:
        x = torch.randn(1, 2, n, n + 1)
        gm = torch.export.export(Pools(k, s, p, d), (x,)).module()
        pools = [nd for nd in gm.graph.nodes if "pool" in str(nd.target)]
        floor = (torch.nn.functional.max_pool2d(x, k, s, p, d).shape, torch.nn.functional.avg_pool2d(x, k, s, p).shape)
        want = [tuple(nd.meta["val"].shape) == tuple(f) for nd, f in zip(pools, floor)]
        assert [ceil_mode_is_noop(nd) for nd in pools] == want, (n, k, s, p, d)
        seen.update(want)
        with torch.no_grad():
            before = gm(x)
        assert drop_noop_ceil_mode(gm) == sum(want)
        with torch.no_grad():
            after = gm(x)
        assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert seen == {True, False}


class _PoolsThatNeedTheirMode(torch.nn.Module):
    def forward(self, a, b):
        return (torch.nn.functional.max_pool2d(a, 2, 2, ceil_mode=True),     # 7x7: ceil mode adds a window
                torch.nn.functional.avg_pool2d(b, 2, 2, ceil_mode=False))


def test_drop_noop_ceil_mode_near_misses_stay():
    a, b = torch.randn(1, 2, 7, 7), torch.randn(1, 2, 8, 8)
    gm = torch.export.export(_PoolsThatNeedTheirMode(), (a, b)).module()
    before, want = str(gm.graph), gm(a, b)
    assert not DropNoopCeilMode().run(gm, PassContext())
    assert str(gm.graph) == before and all(torch.equal(w, g) for w, g in zip(want, gm(a, b)))
