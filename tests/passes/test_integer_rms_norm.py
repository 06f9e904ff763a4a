"""IntegerRMSNorm: an RMSNorm written out (pow, mean, add, rsqrt, mul — transformers' LLaMA
family) over an 8-bit per-tensor value, computed from an exact integer sum of squares
(numerics.rms_norm_integer): the pattern's positive case and near misses, idempotence, the
numerics against the float RMSNorm, bit-exactness on every installed backend, and the
quantizer's side (a float RMSNorm input is quantized under `int8`)."""
import pytest
import torch

import qlower
from qlower import numerics
from qlower.passes import IntegerRMSNorm, PassContext, PassManager, default_pipeline

from conftest import ENGINES

qd = torch.ops.quantized_decomposed
REWRITE = "rms_norm of an 8-bit value -> integer sum of squares"


def rms(x, weight, eps=1e-6, dim=-1):
    """transformers' LlamaRMSNorm.forward, fp32."""
    y = x * torch.rsqrt(x.pow(2).mean(dim, keepdim=True) + eps)
    return weight * y if weight is not None else y


class QRMSNorm(torch.nn.Module):
    """x -> Q/DQ -> RMSNorm over the last dim (weighted or not)."""

    def __init__(self, n=64, dtype=torch.uint8, zp=7, scale=0.05, weighted=True, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.q = (scale, zp, *((0, 255) if dtype == torch.uint8 else (-128, 127)), dtype)
        self.weight = torch.nn.Parameter(torch.randn(n, generator=g) * 0.5 + 1) if weighted else None

    def dq(self, x):
        return qd.dequantize_per_tensor(qd.quantize_per_tensor(x, *self.q), *self.q)

    def forward(self, x):
        return rms(self.dq(x), self.weight)


def lowered(model, x):
    gm = torch.export.export(model, (x,)).module()
    ctx = PassManager(default_pipeline()).run(gm)
    return gm, ctx


def integer_norms(gm):
    return [n for n in gm.graph.nodes if n.target is torch.ops.qlower.rms_norm_integer.default]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_of_an_8_bit_value_uses_an_integer_sum_of_squares(dtype, weighted):
    model = QRMSNorm(dtype=dtype, weighted=weighted, zp=-5 if dtype == torch.int8 else 7).eval()
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(1)) * 2
    gm, ctx = lowered(model, x)
    assert len(integer_norms(gm)) == 1 and ctx.rewrites[REWRITE] == 1
    float_ops = {torch.ops.aten.rsqrt.default, torch.ops.aten.pow.Tensor_Scalar, torch.ops.aten.mean.dim}
    assert not any(n.target in float_ops for n in gm.graph.nodes)
    with torch.no_grad():
        got, want = gm(x), model(x)
    # the float RMSNorm's math, rounded differently: within a few fp32 ulps of PyTorch's
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    assert not IntegerRMSNorm().run(gm, PassContext())   # idempotent


class TwoDequantizes(QRMSNorm):
    """pow and mul read two dequantizes of the same codes (PT2E's convert makes one per use)."""

    def forward(self, x):
        q = qd.quantize_per_tensor(x, *self.q)
        a, b = (qd.dequantize_per_tensor(q, *self.q) for _ in range(2))
        return self.weight * (b * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_two_dequantizes_of_one_value_are_one_input():
    model = TwoDequantizes().eval()
    x = torch.randn(4, 64)
    gm, ctx = lowered(model, x)
    assert len(integer_norms(gm)) == 1
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x), rtol=2e-6, atol=2e-6)


class OtherScaled(QRMSNorm):
    """The normalizing mul reads another value than the squares came from."""

    def forward(self, x):
        d = self.dq(x)
        return self.weight * ((d + 1) * torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + 1e-6))


class MeanReadElsewhere(QRMSNorm):
    def forward(self, x):
        d = self.dq(x)
        ms = d.pow(2).mean(-1, keepdim=True)
        return self.weight * (d * torch.rsqrt(ms + 1e-6)) + ms


class OverFirstDim(QRMSNorm):
    def forward(self, x):
        return rms(self.dq(x), None, dim=0)


class PerChannel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("s", torch.tensor([0.05] * 8))
        self.register_buffer("z", torch.zeros(8, dtype=torch.int64))

    def forward(self, x):
        d = qd.dequantize_per_channel(qd.quantize_per_channel(x, self.s, self.z, 1, 0, 255, torch.uint8),
                                      self.s, self.z, 1, 0, 255, torch.uint8)
        return rms(d, None)


NEAR_MISSES = {
    "float input": (lambda: FloatRMS(), (2, 64)),
    "another value scaled": (OtherScaled, (2, 64)),
    "mean read elsewhere": (MeanReadElsewhere, (2, 64)),
    "over the first dim": (OverFirstDim, (4, 64)),
    "per-channel dequantize": (PerChannel, (2, 8)),
    "N beyond int32 sums": (lambda: QRMSNorm(n=numerics.LAYER_NORM_MAX_N + 1, weighted=False),
                            (1, numerics.LAYER_NORM_MAX_N + 1)),
}


class FloatRMS(torch.nn.Module):
    def forward(self, x):
        return rms(x, None)


@pytest.mark.parametrize("name", list(NEAR_MISSES))
def test_near_misses_keep_the_float_rms_norm(name):
    make, shape = NEAR_MISSES[name]
    model = make().eval()
    x = torch.randn(*shape)
    gm, ctx = lowered(model, x)
    assert not integer_norms(gm) and not ctx.rewrites[REWRITE]
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))


def test_integer_sum_of_squares_handles_zero_rows_and_the_whole_code_range():
    """A row of zero codes (y = 0, not NaN: eps keeps the root positive), rows at the dtype's
    ends, and every code, against the float64 RMSNorm."""
    q = torch.stack([torch.full((256,), 9), torch.arange(256), torch.tensor([0, 255] * 128)]).to(torch.uint8)
    w = torch.linspace(0.5, 2, 256)
    y = numerics.rms_norm_integer(q, 0.037, 9, w, 1e-6)
    assert torch.equal(y[0], torch.zeros(256))
    want = rms((q.to(torch.float64) - 9) * 0.037, w.double())
    torch.testing.assert_close(y.double(), want, rtol=1e-6, atol=1e-6)




@pytest.mark.parametrize("backend", ENGINES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
@pytest.mark.parametrize("n", [96, 300])   # onnxruntime: fp32 sums (N <= 258) and int32 sums
def test_integer_rms_norm_is_bit_exact_on_every_backend(backend, dtype, n):
    """OpenVINO refuses the op (its division is a reciprocal multiply): it runs in PyTorch there,
    exact all the same."""
    model = QRMSNorm(n=n, dtype=dtype, zp=-3 if dtype == torch.int8 else 131, scale=0.0213, seed=3).eval()
    x = torch.randn(4, 7, n) * 2
    ref = qlower.compile(model, (x,), backend="reference")
    cm = qlower.compile(model, (x,), backend=backend)
    if backend != "openvino":
        assert any("qlower::rms_norm_integer" in c.ops for c in cm.report().compiled)
    for seed in range(3):
        xi = torch.randn(4, 7, n, generator=torch.Generator().manual_seed(seed)) * (1 + seed)
        xi[0, 0] = 0.0   # a row of zero-point codes: d = 0, y = 0 (eps keeps the root positive)
        with torch.no_grad():
            assert torch.equal(cm(xi), ref(xi))


class EmbeddingLM(torch.nn.Module):
    """Token embedding -> RMSNorm -> Linear, plus a residual: LLaMA's first layer in small."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 32)
        self.weight = torch.nn.Parameter(torch.rand(32) + 0.5)
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, ids):
        h = self.embed(ids)
        return h + self.proj(rms(h, self.weight))


def test_int8_quantizes_a_float_rms_norm_input_for_the_integer_form():
    """The embedding reaches its RMSNorm in float; `int8` (integer residual stream) quantizes it
    once for both the squares and the normalizing multiply, so the RMSNorm is integer and the
    program is bit-exact on onnxruntime. `transformer` (no integer adds) leaves it float."""
    ids = [torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(s)) for s in range(4)]
    program = qlower.quantize(EmbeddingLM().eval(), (ids[0],), [(i,) for i in ids])
    ref, got = (qlower.compile(program, (ids[0],), backend=b) for b in ("reference", "onnxruntime"))
    assert "qlower::rms_norm_integer" in ref.report().op_counts and "aten::rsqrt" not in ref.report().op_counts
    for i in ids:
        assert torch.equal(got(i), ref(i))
    accurate = qlower.quantize(EmbeddingLM().eval(), (ids[0],), [(i,) for i in ids], config="transformer")
    assert "qlower::rms_norm_integer" not in qlower.compile(accurate, (ids[0],), backend="reference").report().op_counts
