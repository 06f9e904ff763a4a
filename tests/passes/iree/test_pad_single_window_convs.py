"""PadSingleWindowConvs (iree legalization): a float conv2d with one window stopping short of the
input's end reads an explicitly padded input cropped to that window (positive, values bit for
bit, idempotence, a dynamic batch kept symbolic); kernel 1, a window ending at the input's end
and two windows are left (near misses)."""
import torch

from qlower.passes import PassContext
from qlower.passes.iree.pad_single_window_convs import PadSingleWindowConvs


def test_single_window_convs_pass_contract():
    """Positive (H has one window stopping short: cropped, its padding written out), near misses
    (kernel 1; a window ending at the input's end; two windows), values bit for bit,
    idempotence."""
    from qlower.passes.iree.pad_single_window_convs import PadSingleWindowConvs, short_single_window_dims
    from qlower.passes import PassContext, PassManager

    class Convs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.short = torch.nn.Conv2d(2, 3, 3, stride=(4, 1), padding=1)   # H 3: span 2 < 4; W 6: many
            self.one = torch.nn.Conv2d(2, 3, 1, stride=4)                       # kernel 1
            self.exact = torch.nn.Conv2d(2, 3, 3, stride=(4, 1), padding=0)    # H 3: span 0
            self.two = torch.nn.Conv2d(2, 3, 2, stride=1)                       # H 3: two windows

        def forward(self, x):
            return self.short(x).sum() + self.one(x).sum() + self.exact(x).sum() + self.two(x[:, :, :, :4]).sum()

    x = torch.randn(1, 2, 3, 6)
    gm = torch.export.export(Convs().eval(), (x,)).module()
    convs = [n for n in gm.graph.nodes if n.target is torch.ops.aten.conv2d.default]
    assert [short_single_window_dims(n) for n in convs] == [[0], [], [], []]
    want = gm(x)
    ctx = PassManager([PadSingleWindowConvs()]).run(gm, PassContext())
    assert sum(ctx.rewrites.values()) == 1
    assert sum(n.target is torch.ops.aten.constant_pad_nd.default for n in gm.graph.nodes) == 1
    torch.testing.assert_close(gm(x), want, rtol=0, atol=0)
    assert not PassManager([PadSingleWindowConvs()]).run(gm, PassContext()).rewrites   # idempotent
    # a dynamic batch stays symbolic (constant_pad_nd's own fake kernel specializes it)
    dynamic = torch.export.export(Convs().eval(), (torch.randn(2, 2, 3, 6),),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},)).module()
    PassManager([PadSingleWindowConvs()]).run(dynamic, PassContext())
    (x_node,) = [n for n in dynamic.graph.nodes if n.op == "placeholder" and n.name == "x"]
    pad = next(n for n in dynamic.graph.nodes if n.target is torch.ops.aten.constant_pad_nd.default)
    assert not isinstance(x_node.meta["val"].shape[0], int) and not isinstance(pad.meta["val"].shape[0], int)


class _ConvsThatFit(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.one = torch.nn.Conv2d(2, 3, 1, stride=4)                       # kernel 1
        self.exact = torch.nn.Conv2d(2, 3, 3, stride=(4, 1), padding=0)    # H 3: span 0
        self.two = torch.nn.Conv2d(2, 3, 2, stride=1)                       # H 3: two windows

    def forward(self, x):
        return self.one(x).sum() + self.exact(x).sum() + self.two(x).sum()


def test_single_window_convs_near_misses_stay():
    x = torch.randn(1, 2, 3, 6)
    gm = torch.export.export(_ConvsThatFit().eval(), (x,)).module()
    before, want = str(gm.graph), gm(x)
    assert not PadSingleWindowConvs().run(gm, PassContext())
    assert str(gm.graph) == before and torch.equal(gm(x), want)
