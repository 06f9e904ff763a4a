"""TabulatePointwise: float pointwise regions between 8-bit Q/DQ become one qlower.table lookup.
Checked on every code of the input dtype: the pass's positive cases, the near misses it must
leave alone, idempotence, numerics identical before/after, and the lookup bit-exact on every
installed backend."""
import importlib.util

import pytest
import torch
import torch.nn.functional as F

import qlower
from qlower import numerics
from qlower.errors import NumericsError
from qlower.passes import PassContext, PassManager, TabulatePointwise, default_pipeline

qd = torch.ops.quantized_decomposed
RANGE = {torch.uint8: (0, 255), torch.int8: (-128, 127)}


class Island(torch.nn.Module):
    """x -> Q/DQ (in) -> fn -> Q/DQ (out); `extra` returns the float region value as well."""

    def __init__(self, fn, in_dtype=torch.uint8, out_dtype=torch.uint8, in_scale=0.0625, out_scale=0.03125,
                 extra=False):
        super().__init__()
        self.fn, self.extra = fn, extra
        self.qin = (in_scale, 3 if in_dtype == torch.uint8 else -5, *RANGE[in_dtype], in_dtype)
        self.qout = (out_scale, 120 if out_dtype == torch.uint8 else 2, *RANGE[out_dtype], out_dtype)

    def forward(self, x):
        d = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, *self.qin), *self.qin)
        y = self.fn(d)
        out = qd.dequantize_per_tensor(qd.quantize_per_tensor(y, *self.qout), *self.qout)
        return (out, y) if self.extra else out


def every_code(model: Island) -> torch.Tensor:
    """An input whose quantization holds every code of the input dtype once, as [2, 128]."""
    scale, zp, lo, hi, _ = model.qin
    return ((torch.arange(lo, hi + 1, dtype=torch.float32) - zp) * scale).reshape(2, 128)


def lowered(model, x, tabulate=True):
    gm = torch.export.export(model, (x,)).module()
    passes = [p for p in default_pipeline() if tabulate or not isinstance(p, TabulatePointwise)]
    ctx = PassManager(passes).run(gm)
    return gm, ctx


def float_ops(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and str(n.target).startswith("aten.")]


def tables(gm):
    return [n for n in gm.graph.nodes if n.target is torch.ops.qlower.table.default]


FUNCTIONS = {
    "gelu": F.gelu,
    "gelu-tanh": lambda d: F.gelu(d, approximate="tanh"),
    "sigmoid": torch.sigmoid,
    "silu-decomposed": lambda d: d * torch.sigmoid(d),
    "hardswish": F.hardswish,
    "affine-tanh": lambda d: torch.tanh(d * 0.7 + 0.1) * 2.0,
    "exp": lambda d: torch.exp(d - 4.0),
}
DTYPES = [(torch.uint8, torch.uint8), (torch.int8, torch.uint8), (torch.uint8, torch.int8), (torch.int8, torch.int8)]


@pytest.mark.parametrize("name", list(FUNCTIONS))
@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: f"{str(d[0])[6:]}-{str(d[1])[6:]}")
def test_pointwise_region_becomes_one_table_with_identical_outputs(name, dtypes):
    model = Island(FUNCTIONS[name], *dtypes)
    x = every_code(model)
    gm, ctx = lowered(model, x)
    untouched, _ = lowered(model, x, tabulate=False)
    assert len(tables(gm)) == 1 and not float_ops(gm) and ctx.rewrites["pointwise region -> qlower.table"] == 1
    assert float_ops(untouched)   # the region was there to tabulate
    assert torch.equal(gm(x), untouched(x))   # every code: the table holds what the float ops computed
    assert not TabulatePointwise().run(gm, PassContext())   # idempotent


class TwoInputs(torch.nn.Module):
    def forward(self, x, z):
        q = (0.05, 0, 0, 255, torch.uint8)
        a = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, *q), *q)
        b = qd.dequantize_per_tensor(qd.quantize_per_tensor(z, *q), *q)
        return qd.dequantize_per_tensor(qd.quantize_per_tensor(torch.sigmoid(a + b), *q), *q)


class PerChannelIn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("s", torch.tensor([0.05, 0.1]))
        self.register_buffer("z", torch.tensor([0, 7]))

    def forward(self, x):
        q = qd.quantize_per_channel(x, self.s, self.z, 1, 0, 255, torch.uint8)
        d = qd.dequantize_per_channel(q, self.s, self.z, 1, 0, 255, torch.uint8)
        o = (0.01, 0, 0, 255, torch.uint8)
        return qd.dequantize_per_tensor(qd.quantize_per_tensor(torch.sigmoid(d), *o), *o)


ROWS = (torch.randn(2, 128),)
NEAR_MISSES = {
    "softmax (not pointwise)": (Island(lambda d: torch.softmax(d, -1)), ROWS),
    "region value read outside": (Island(torch.sigmoid, extra=True), ROWS),
    "two different dequantizes": (TwoInputs(), (torch.randn(2, 8), torch.randn(2, 8))),
    "per-channel dequantize": (PerChannelIn(), (torch.randn(4, 2),)),
    "tensor operand not a constant": (Island(lambda d: d * torch.arange(128.0)), ROWS),
}


@pytest.mark.parametrize("name", list(NEAR_MISSES))
def test_near_misses_stay_float(name):
    model, inputs = NEAR_MISSES[name]
    gm = torch.export.export(model, inputs).module()
    want = model(*inputs)
    ctx = PassManager(default_pipeline()).run(gm)
    assert not tables(gm) and not ctx.rewrites["pointwise region -> qlower.table"]
    got = gm(*inputs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(g, w)


def test_table_lookup_numerics_and_typed_error():
    table = torch.arange(256, dtype=torch.int32).flip(0).to(torch.uint8)
    q = torch.tensor([-128, -1, 0, 127], dtype=torch.int8)
    assert numerics.table_lookup(q, table).tolist() == [255, 128, 127, 0]
    with pytest.raises(NumericsError, match="256 entries"):
        numerics.table_lookup(q, table[:10])


def _backends():
    names = ["onnxruntime"]
    if importlib.util.find_spec("iree.compiler") and importlib.util.find_spec("iree.runtime"):
        names.append("iree")
    if importlib.util.find_spec("openvino"):
        names.append("openvino")
    return names


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: f"{str(d[0])[6:]}-{str(d[1])[6:]}")
def test_table_is_bit_exact_on_every_backend(backend, dtypes):
    # power-of-two scales: OpenVINO quantizes those canonically, so the whole island is one cluster
    model = Island(F.gelu, *dtypes, in_scale=2.0 ** -4, out_scale=2.0 ** -6)
    x = every_code(model)
    want = qlower.compile(model, (x,), backend="reference")(x)
    cm = qlower.compile(model, (x,), backend=backend)
    report = cm.report()
    assert [c.status for c in report.clusters] == ["compiled"] and "qlower::table" in report.clusters[0].ops
    assert torch.equal(cm(x), want)
    assert torch.equal(cm(x.flip(-1)), qlower.compile(model, (x,), backend="reference")(x.flip(-1)))
