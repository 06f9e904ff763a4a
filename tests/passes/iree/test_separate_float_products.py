"""SeparateFloatProducts (IREE legalization): IREE contracts a float multiply and the add that
reads it into one FMA (one rounding, where PyTorch and the other engines round twice); a
clamp_min(-inf) between them keeps IEEE's two roundings. Positive case, near misses,
idempotence, values unchanged, and the end-to-end effect on IREE (float and int8 rotary)."""
import pytest
import torch

import qlower
from qlower.passes import PassContext
from qlower.passes.iree.separate_float_products import SeparateFloatProducts

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed
REWRITE = "iree: float products read by a sum kept apart (clamp_min -inf: no FMA contraction)"


class SumOfProducts(torch.nn.Module):
    def forward(self, a, b, c, d):
        return a * b + c * d


class Shapes(torch.nn.Module):
    """Near misses: a product of a product, a sum of sums, integer arithmetic."""

    def forward(self, a, b, c, d):
        i = a.to(torch.int32)
        return (a * b) * c, (a + b) - d, i * 3 + i


def _inputs(n=1 << 16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, generator=g) for _ in range(4))


def _clamps(gm):
    return [n for n in gm.graph.nodes if n.target is aten.clamp_min.default]


def test_products_read_by_a_sum_get_a_barrier_and_keep_their_values():
    x = _inputs(64)
    gm = torch.export.export(SumOfProducts(), x).module()
    ctx = PassContext()
    assert SeparateFloatProducts().run(gm, ctx)
    assert len(_clamps(gm)) == 2 and ctx.rewrites[REWRITE] == 2
    assert torch.equal(gm(*x), SumOfProducts()(*x))
    special = torch.zeros(64)
    special[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    y = (special, torch.ones(64), torch.zeros(64), torch.ones(64))
    torch.testing.assert_close(gm(*y), SumOfProducts()(*y), equal_nan=True)   # the identity, NaN and inf too
    assert not SeparateFloatProducts().run(gm, PassContext())   # idempotent


def test_near_misses_stay_as_they_are():
    x = _inputs(8)
    gm = torch.export.export(Shapes(), x).module()
    assert not SeparateFloatProducts().run(gm, PassContext()) and not _clamps(gm)


def test_iree_sums_of_products_equal_pytorch_bit_for_bit():
    """Without the barrier 16,040 of 2^16 results are off in the last bit (AMD EPYC Zen 3, IREE 3.13)."""
    pytest.importorskip("iree.compiler", reason="the iree extra is not installed")
    pytest.importorskip("iree.runtime", reason="the iree extra is not installed")
    x = _inputs()
    cm = qlower.compile(SumOfProducts(), x, backend="iree")
    assert cm.report().fallbacks == []
    assert torch.equal(cm(*x), SumOfProducts()(*x))


class QuantizedRotary(torch.nn.Module):
    """LLaMA's rotary embedding between an 8-bit dequantize and a quantize, constant tables."""

    def __init__(self):
        super().__init__()
        pos = torch.arange(32.0)[:, None] * (10000.0 ** (-torch.arange(0, 32, 2).float() / 32))
        emb = torch.cat([pos, pos], -1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        self.qi, self.qo = (0.03, 128, 0, 255, torch.uint8), (0.011, 128, 0, 255, torch.uint8)

    def forward(self, x):
        d = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, *self.qi), *self.qi)
        rotated = torch.cat([-d[..., 16:], d[..., :16]], -1)
        y = (d * self.cos + rotated * self.sin) * 0.17677669529663687
        return qd.dequantize_per_tensor(qd.quantize_per_tensor(y, *self.qo), *self.qo)


def test_iree_int8_rotary_equals_the_reference_bit_for_bit():
    """Without the barrier 5 of 5.2 million codes flip (an FMA's single rounding landing across a
    rounding boundary of the quantize)."""
    pytest.importorskip("iree.compiler", reason="the iree extra is not installed")
    pytest.importorskip("iree.runtime", reason="the iree extra is not installed")
    x = torch.randn(64, 4, 32, 32)
    ref, got = (qlower.compile(QuantizedRotary(), (x,), backend=b) for b in ("reference", "iree"))
    assert got.report().fallbacks == []
    for seed in range(20):
        xi = torch.randn(64, 4, 32, 32, generator=torch.Generator().manual_seed(seed)) * 2
        assert torch.equal(got(xi), ref(xi))
