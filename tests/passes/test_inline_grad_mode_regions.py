"""InlineGradModeRegions: a `wrap_with_set_grad_enabled` region is spliced into the main graph
(positive, values, idempotence); another higher-order op (an autocast region) is left (near
miss)."""
import torch

from qlower.passes import PassContext, PassManager


class NoGradRegion(torch.nn.Module):
    def forward(self, x):
        with torch.no_grad():
            y = torch.sin(x) * 2
        return y + x


def test_inline_grad_mode_regions():
    from torch._higher_order_ops.wrap import wrap_with_set_grad_enabled
    from qlower.passes import InlineGradModeRegions
    x = torch.randn(2, 3)
    gm = torch.export.export(NoGradRegion(), (x,)).module()
    assert any(n.target is wrap_with_set_grad_enabled for n in gm.graph.nodes)  # torch 2.13 (pinned) keeps it
    want = gm(x)
    ctx = PassManager([InlineGradModeRegions()]).run(gm, PassContext())
    assert ctx.rewrites and not any(n.target is wrap_with_set_grad_enabled for n in gm.graph.nodes)
    assert torch.equal(gm(x), want)
    assert not PassManager([InlineGradModeRegions()]).run(gm, PassContext()).rewrites


class AutocastRegion(torch.nn.Module):
    def forward(self, x):
        with torch.autocast("cpu", enabled=False):
            y = torch.sin(x) * 2
        return y + x


def test_inline_grad_mode_regions_leaves_other_higher_order_ops():
    from torch._higher_order_ops.wrap import wrap_with_autocast
    from qlower.passes import InlineGradModeRegions
    x = torch.randn(2, 3)
    gm = torch.export.export(AutocastRegion(), (x,)).module()
    assert any(n.target is wrap_with_autocast for n in gm.graph.nodes)
    before, want = str(gm.graph), gm(x)
    assert not InlineGradModeRegions().run(gm, PassContext())
    assert str(gm.graph) == before and torch.equal(gm(x), want)
