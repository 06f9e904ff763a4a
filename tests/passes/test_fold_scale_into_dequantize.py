"""FoldScaleIntoDequantize: a multiply by a power of two after a dequantize becomes part of its
scale, bit-identical and idempotent; a factor that is not a power of two and a dequantize with
another user are left (near misses)."""
import pytest
import torch

from qlower.passes import AttachQParams, PassContext, PassManager


class ScaledDequant(torch.nn.Module):
    def __init__(self, factor, reuse=False):
        super().__init__()
        self.factor, self.reuse = factor, reuse

    def forward(self, x):
        q = torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.037, 120, 0, 255, torch.uint8)
        d = torch.ops.quantized_decomposed.dequantize_per_tensor(q, 0.037, 120, 0, 255, torch.uint8)
        y = torch.softmax(d * self.factor, -1)
        return y + d if self.reuse else y


def _scale_folded(model, x):
    from qlower.passes import CanonicalizeQDQ, FoldScaleIntoDequantize
    gm = torch.export.export(model, (x,)).module()
    reference = gm(x)
    ctx = PassManager([AttachQParams(), CanonicalizeQDQ(), FoldScaleIntoDequantize()]).run(gm)
    muls = [n for n in gm.graph.nodes if n.target == torch.ops.aten.mul.Tensor]
    return gm, ctx, muls, reference


@pytest.mark.parametrize("factor", [0.25, 0.125, 4.0])
def test_fold_scale_into_dequantize_power_of_two(factor):
    x = torch.randn(4, 16) * 3
    gm, ctx, muls, reference = _scale_folded(ScaledDequant(factor), x)
    assert not muls and ctx.rewrites["power-of-two scale folded into dequantize"] == 1
    assert torch.equal(gm(x), reference)  # bit-identical
    from qlower.passes import FoldScaleIntoDequantize
    assert not FoldScaleIntoDequantize().run(gm, PassContext())  # idempotent


@pytest.mark.parametrize("model", [ScaledDequant(0.3), ScaledDequant(0.25, reuse=True)], ids=["not-pow2", "shared-dq"])
def test_fold_scale_into_dequantize_near_misses(model):
    x = torch.randn(4, 16)
    gm, ctx, muls, reference = _scale_folded(model, x)
    assert len(muls) == 1 and not ctx.rewrites
    assert torch.equal(gm(x), reference)
