"""IntegerSoftmax: a softmax over the last dim of an 8-bit per-tensor value from an exp table and
an exact int32 sum (numerics.softmax_integer): the pass's positive case and near misses,
idempotence, the numerics against PyTorch's float softmax, bit-exactness on every backend."""

import pytest
import torch

import qlower
from qlower import numerics
from qlower.passes import IntegerSoftmax, PassContext, PassManager, default_pipeline

from conftest import ENGINES

qd = torch.ops.quantized_decomposed


class QSoftmax(torch.nn.Module):
    def __init__(self, dtype=torch.uint8, zp=100, scale=0.06, dim=-1):
        super().__init__()
        self.q = (scale, zp, *((0, 255) if dtype == torch.uint8 else (-128, 127)), dtype)
        self.dim = dim

    def forward(self, x):
        d = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, *self.q), *self.q)
        return torch.softmax(d, self.dim)


def lowered(model, *inputs, dynamic=None):
    gm = torch.export.export(model, inputs, dynamic_shapes=dynamic).module()
    ctx = PassManager(default_pipeline()).run(gm)
    return gm, ctx


def integer_softmaxes(gm):
    return [n for n in gm.graph.nodes if n.target is torch.ops.qlower.softmax_integer.default]


@pytest.mark.parametrize("dtype, zp", [(torch.uint8, 100), (torch.int8, -7)])
@pytest.mark.parametrize("scale", [0.01, 0.06, 0.5])
def test_softmax_of_an_8_bit_value_uses_the_exp_table(dtype, zp, scale):
    model = QSoftmax(dtype, zp, scale)
    x = torch.randn(2, 4, 16, 40) * 3
    gm, ctx = lowered(model, x)
    assert len(integer_softmaxes(gm)) == 1 and ctx.rewrites["softmax of an 8-bit value -> exp table"] == 1
    got, want = gm(x), model(x)
    # each table entry is within 1/2 of exact on a 2^-16 grid and the row maximum's is exact, so
    # with S >= 2^16: |p - p_float| <= (1/2 + N/2 * p) / 2^16 <= (N + 1) / 2^17 (float rounding aside)
    n = x.shape[-1]
    assert float((got - want).abs().max()) <= (n + 1) / 2 ** 17
    torch.testing.assert_close(got.sum(-1), torch.ones(2, 4, 16), rtol=0, atol=1e-5)
    assert not IntegerSoftmax().run(gm, PassContext())   # idempotent


class PerChannel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("s", torch.tensor([0.05, 0.1, 0.2]))
        self.register_buffer("z", torch.zeros(3, dtype=torch.int64))

    def forward(self, x):
        d = qd.dequantize_per_channel(qd.quantize_per_channel(x, self.s, self.z, 1, 0, 255, torch.uint8),
                                      self.s, self.z, 1, 0, 255, torch.uint8)
        return torch.softmax(d, -1)


NEAR_MISSES = {
    "float input": (lambda: torch.nn.Softmax(-1), (2, 8)),
    "another dim": (lambda: QSoftmax(dim=1), (2, 8, 5)),
    "per-channel dequantize": (PerChannel, (2, 3, 8)),
    "row too long for an int32 sum": (QSoftmax, (1, numerics.SOFTMAX_MAX_N + 1)),
}


@pytest.mark.parametrize("name", list(NEAR_MISSES))
def test_near_misses_keep_the_float_softmax(name):
    make, shape = NEAR_MISSES[name]
    model = make()
    x = torch.randn(*shape)
    gm, ctx = lowered(model, x)
    assert not integer_softmaxes(gm) and not ctx.rewrites["softmax of an 8-bit value -> exp table"]
    assert torch.equal(gm(x), model(x))


def test_a_symbolic_row_length_counts_by_its_declared_max():
    x = torch.randn(2, 16)
    bounded, _ = lowered(QSoftmax(), x, dynamic=({1: torch.export.Dim("seq", max=4096)},))
    unbounded, _ = lowered(QSoftmax(), x, dynamic=({1: torch.export.Dim("seq")},))
    assert len(integer_softmaxes(bounded)) == 1 and not integer_softmaxes(unbounded)


def test_exp_table_edges():
    table = numerics.softmax_exp_table(0.06)
    assert table.dtype == torch.int32 and int(table[0]) == 2 ** 16 and bool((table[1:] < 2 ** 16).all())
    assert bool((table[:-1] >= table[1:]).all())   # non-increasing in k
    q = torch.tensor([[5, 5, 5, 5], [0, 255, 0, 255]], dtype=torch.uint8)
    p = numerics.softmax_integer(q, table)
    assert torch.equal(p[0], torch.full((4,), 0.25))        # a constant row: uniform, exactly
    assert float(p[1, 0]) == float(table[255]) / float(2 * table[255] + 2 * 2 ** 16)




@pytest.mark.parametrize("backend", ENGINES)
@pytest.mark.parametrize("dtype, zp, scale", [(torch.uint8, 131, 0.0213), (torch.int8, -3, 0.2), (torch.uint8, 0, 2.0)])
def test_integer_softmax_is_bit_exact_on_every_backend(backend, dtype, zp, scale):
    """OpenVINO refuses the op (its division is a reciprocal multiply) and runs it in PyTorch."""
    model = QSoftmax(dtype, zp, scale)
    x = torch.randn(3, 6, 50)
    ref = qlower.compile(model, (x,), backend="reference")
    cm = qlower.compile(model, (x,), backend=backend)
    if backend != "openvino":
        assert any("qlower::softmax_integer" in c.ops for c in cm.report().compiled)
    for seed in range(3):
        xi = torch.randn(3, 6, 50, generator=torch.Generator().manual_seed(seed)) * (1 + 3 * seed)
        xi[0, 0] = 0.7   # a constant row
        assert torch.equal(cm(xi), ref(xi))


# ------------------------------------------------------------------ masked (attention's padding mask)
class QMaskedSoftmax(QSoftmax):
    """softmax(masked_fill(x, ~keep, fill)) as quantize_attention decomposes a boolean attn_mask."""

    def __init__(self, *args, fill=float("-inf"), **kwargs):
        super().__init__(*args, **kwargs)
        self.fill = fill

    def forward(self, x, keep):
        d = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, *self.q), *self.q)
        return torch.softmax(d.masked_fill(~keep, self.fill), -1)


def padding_keep(batch: int, length: int, seed: int = 0, empty_row: bool = False) -> torch.Tensor:
    """[batch, 1, 1, length]: True for each row's first n keys (n drawn), as a padding mask."""
    n = torch.randint(1, length + 1, (batch,), generator=torch.Generator().manual_seed(seed))
    if empty_row:
        n[0] = 0
    return (torch.arange(length)[None] < n[:, None])[:, None, None, :]


def test_masked_softmax_uses_the_exp_table_over_kept_entries():
    """Positive: the masked form becomes one softmax_integer with the keep mask (the not and the
    masked_fill gone); masked entries are exactly 0, kept ones within the table's bound of the
    float softmax; a row with nothing kept is NaN, as eager; idempotent."""
    model = QMaskedSoftmax(torch.uint8, 100, 0.06)
    x, keep = torch.randn(2, 4, 16, 40) * 3, padding_keep(2, 40)
    gm, ctx = lowered(model, x, keep)
    assert len(integer_softmaxes(gm)) == 1 and ctx.rewrites["masked softmax of an 8-bit value -> exp table"] == 1
    assert not any(n.target in (torch.ops.aten.masked_fill.Scalar, torch.ops.aten.bitwise_not.default)
                   for n in gm.graph.nodes)
    got, want = gm(x, keep), model(x, keep)
    assert bool((got.masked_select(~keep.expand_as(got)) == 0).all())
    assert float((got - want).abs().max()) <= (40 + 1) / 2 ** 17
    assert not IntegerSoftmax().run(gm, PassContext())   # idempotent
    empty = padding_keep(2, 40, empty_row=True)
    assert torch.equal(gm(x, empty).isnan(), model(x, empty).isnan()) and bool(gm(x, empty)[0].isnan().all())


def test_masked_codes_above_the_kept_maximum_do_not_push_kept_entries_down():
    """The row maximum is over kept codes: with the masked code 255 in the max, the kept codes
    (k = 205..255 away, scale 0.06: exp(-12.3) and below) would all read table zeros."""
    table = numerics.softmax_exp_table(0.06)
    q = torch.tensor([[255, 0, 50, 30]], dtype=torch.uint8)
    keep = torch.tensor([[False, True, True, True]])
    p = numerics.softmax_integer(q, table, keep)
    assert float(p[0, 0]) == 0 and torch.equal(p[:, 1:], numerics.softmax_integer(q[:, 1:], table))


def test_masked_fill_with_another_value_keeps_the_float_softmax():
    """Near miss: a large negative fill (an additive-mask idiom) is not a mask: its entries count."""
    model = QMaskedSoftmax(fill=-1e4)
    x, keep = torch.randn(2, 8) * 3, torch.tensor([[True] * 6 + [False] * 2] * 2)
    gm, ctx = lowered(model, x, keep)
    assert not integer_softmaxes(gm) and torch.equal(gm(x, keep), model(x, keep))


@pytest.mark.parametrize("backend", ENGINES)
@pytest.mark.parametrize("dtype, zp, scale", [(torch.uint8, 131, 0.0213), (torch.int8, -3, 0.2)])
def test_masked_integer_softmax_is_bit_exact_on_every_backend(backend, dtype, zp, scale):
    """Every backend runs the masked form bit for bit like the reference (OpenVINO refuses
    softmax_integer and runs it in PyTorch), with a fully masked row (NaN) among them."""
    model = QMaskedSoftmax(dtype, zp, scale)
    x, keep = torch.randn(3, 2, 5, 50), padding_keep(3, 50)
    ref = qlower.compile(model, (x, keep), backend="reference")
    cm = qlower.compile(model, (x, keep), backend=backend)
    if backend != "openvino":
        assert any("qlower::softmax_integer" in c.ops for c in cm.report().compiled) and not cm.report().fallbacks
    for seed in range(3):
        xi = torch.randn(3, 2, 5, 50, generator=torch.Generator().manual_seed(seed)) * (1 + 3 * seed)
        ki = padding_keep(3, 50, seed, empty_row=seed == 2)
        torch.testing.assert_close(cm(xi, ki), ref(xi, ki), rtol=0, atol=0, equal_nan=True)
