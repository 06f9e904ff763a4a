"""IntegerLayerNorm: a LayerNorm of an 8-bit per-tensor value computed from exact integer
statistics (numerics.layer_norm_integer): the pass's positive case and near misses, idempotence,
the numerics against PyTorch's float LayerNorm, and bit-exactness on every installed backend
(the zoo transformers' int8 outputs against the reference's: tests/test_e2e.py)."""
import pytest
import torch
import torch.nn.functional as F

import qlower
from qlower import numerics
from qlower.passes import IntegerLayerNorm, PassContext, PassManager, default_pipeline

from conftest import ENGINES

qd = torch.ops.quantized_decomposed


class QLayerNorm(torch.nn.Module):
    """x -> Q/DQ -> LayerNorm over the last `dims` dims (affine or not)."""

    def __init__(self, n=64, dtype=torch.uint8, zp=7, scale=0.05, affine=True, dims=1, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.q = (scale, zp, *((0, 255) if dtype == torch.uint8 else (-128, 127)), dtype)
        shape = [n] if dims == 1 else [4, n]
        self.shape = shape
        self.weight = torch.nn.Parameter(torch.randn(shape, generator=g) * 0.5 + 1) if affine else None
        self.bias = torch.nn.Parameter(torch.randn(shape, generator=g) * 0.1) if affine else None

    def forward(self, x):
        d = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, *self.q), *self.q)
        return F.layer_norm(d, self.shape, self.weight, self.bias, 1e-5)


def lowered(model, x):
    gm = torch.export.export(model, (x,)).module()
    ctx = PassManager(default_pipeline()).run(gm)
    return gm, ctx


def integer_norms(gm):
    return [n for n in gm.graph.nodes if n.target is torch.ops.qlower.layer_norm_integer.default]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_of_an_8_bit_value_uses_integer_statistics(dtype, affine):
    model = QLayerNorm(dtype=dtype, affine=affine).eval()
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(1)) * 2
    gm, ctx = lowered(model, x)
    assert len(integer_norms(gm)) == 1 and ctx.rewrites["layer_norm of an 8-bit value -> integer statistics"] == 1
    assert not any(n.target is torch.ops.aten.layer_norm.default for n in gm.graph.nodes)
    with torch.no_grad():
        got, want = gm(x), model(x)
    # the float LayerNorm's math, rounded differently: within a few fp32 ulps of PyTorch's
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    assert not IntegerLayerNorm().run(gm, PassContext())   # idempotent


class PerChannel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("s", torch.tensor([0.05] * 8))
        self.register_buffer("z", torch.zeros(8, dtype=torch.int64))

    def forward(self, x):
        d = qd.dequantize_per_channel(qd.quantize_per_channel(x, self.s, self.z, 2, 0, 255, torch.uint8),
                                      self.s, self.z, 2, 0, 255, torch.uint8)
        return F.layer_norm(d, [8])


class ComputedWeight(QLayerNorm):
    """The weight is computed from the input (constant weights are folded before the pass)."""

    def forward(self, x):
        d = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, *self.q), *self.q)
        return F.layer_norm(d, self.shape, x[0].sigmoid(), self.bias, 1e-5)


NEAR_MISSES = {
    "float input": (lambda: torch.nn.LayerNorm(64), (2, 64)),
    "per-channel dequantize": (PerChannel, (2, 3, 8)),
    "over two dims": (lambda: QLayerNorm(dims=2), (2, 4, 64)),
    "computed weight": (ComputedWeight, (2, 64)),
    "N beyond int32 sums": (lambda: QLayerNorm(n=numerics.LAYER_NORM_MAX_N + 1, affine=False),
                            (1, numerics.LAYER_NORM_MAX_N + 1)),
}


@pytest.mark.parametrize("name", list(NEAR_MISSES))
def test_near_misses_keep_the_float_layer_norm(name):
    make, shape = NEAR_MISSES[name]
    model = make().eval()
    x = torch.randn(*shape)
    gm, ctx = lowered(model, x)
    assert not integer_norms(gm) and not ctx.rewrites["layer_norm of an 8-bit value -> integer statistics"]
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))


def test_integer_statistics_handle_constant_rows_and_the_whole_code_range():
    """A constant row (variance 0: y = beta), rows at the dtype's ends, and every code."""
    q = torch.stack([torch.full((256,), 9), torch.arange(256), torch.tensor([0, 255] * 128)]).to(torch.uint8)
    w, b = torch.linspace(0.5, 2, 256), torch.linspace(-1, 1, 256)
    y = numerics.layer_norm_integer(q, 0.037, 9, w, b, 1e-5)
    assert torch.equal(y[0], b)   # t = 0 everywhere: 0 / D * w + b
    want = F.layer_norm(((q.to(torch.float64) - 9) * 0.037), [256], w.double(), b.double(), 1e-5)
    torch.testing.assert_close(y.double(), want, rtol=1e-6, atol=1e-6)




@pytest.mark.parametrize("backend", ENGINES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
@pytest.mark.parametrize("n", [96, 300])   # onnxruntime: fp32 sums (N <= 258) and int32 sums
def test_integer_layer_norm_is_bit_exact_on_every_backend(backend, dtype, n):
    """OpenVINO refuses the op (its division is a reciprocal multiply): it runs in PyTorch there,
    exact all the same."""
    model = QLayerNorm(n=n, dtype=dtype, zp=-3 if dtype == torch.int8 else 131, scale=0.0213, seed=3).eval()
    x = torch.randn(4, 7, n) * 2
    ref = qlower.compile(model, (x,), backend="reference")
    cm = qlower.compile(model, (x,), backend=backend)
    if backend != "openvino":
        assert any("qlower::layer_norm_integer" in c.ops for c in cm.report().compiled)
    for seed in range(3):
        xi = torch.randn(4, 7, n, generator=torch.Generator().manual_seed(seed)) * (1 + seed)
        xi[0, 0] = 0.3   # a constant row
        with torch.no_grad():
            assert torch.equal(cm(xi), ref(xi))
