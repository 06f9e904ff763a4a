"""openvino backend: every integer op it runs is bit-exact against the reference kernels (one-op
graphs, exhaustive where the domain is small), quantize with a non-power-of-two scale is refused
under the canonical profile (and declared under the engine-native one), no ONNX Runtime contrib
op reaches OpenVINO, fp32 zoo models are one cluster within float tolerance, fallbacks work.
Skipped without the `openvino` extra."""
import sys

import onnx
import pytest
import torch

pytest.importorskip("openvino", reason="the openvino extra is not installed (pip install 'qlower[openvino]')")

import qlower  # noqa: E402
from qlower.backends import AUTO_ORDER, get_backend  # noqa: E402
from qlower.backends.base import compile_graph  # noqa: E402
from qlower.backends.openvino import OpenVinoBackend, OvOptions, openvino_capability  # noqa: E402
from qlower.errors import BackendError  # noqa: E402
from qlower.numerics_vectors import EDGE_SCALES as BASE_EDGE_SCALES  # noqa: E402
from qlower.numerics_vectors import tie_vector as edge_tie_vector  # noqa: E402
from qlower.zoo import ZOO  # noqa: E402
from qdq_models import IntegerLinear as Linear

ops = torch.ops.qlower
U8, S8 = torch.uint8, torch.int8


def rng(dtype):
    return (0, 255) if dtype == U8 else (-128, 127)


def compile_both(module, *inputs, options=None):
    """(reference outputs, openvino outputs, executable) for a module of qlower ops, captured as
    the pipeline captures models (constants become get_attr nodes)."""
    gm = torch.export.export(module, inputs).module()
    exe = compile_graph(OpenVinoBackend(options), gm)
    with torch.no_grad():
        return gm(*inputs), exe.run(*inputs), exe


def assert_all_on_openvino(exe):
    bad = [(c.id, c.backend, c.status, c.reason) for c in exe.clusters
           if c.backend != "openvino" or c.status != "compiled"]
    assert not bad, bad


def assert_equal(ref, got):
    """Every element equal (floats bit for bit, NaN == NaN)."""
    for r, g in zip(torch.utils._pytree.tree_leaves(ref), torch.utils._pytree.tree_leaves(got)):
        assert r.dtype == g.dtype and r.shape == g.shape
        if r.dtype.is_floating_point:
            diff = (r.view(torch.int32) != g.view(torch.int32)) & ~(r.isnan() & g.isnan())
        else:
            diff = r.to(torch.int64) != g.to(torch.int64)
        assert int(diff.sum()) == 0, f"{int(diff.sum())} of {r.numel()} elements differ"


def random_q(shape, dtype, g):
    lo, hi = rng(dtype)
    return torch.randint(lo, hi + 1, shape, generator=g, dtype=dtype)


# ------------------------------------------------------------------------------ registration
def test_registered_not_in_auto_order_and_options_typed():
    assert isinstance(get_backend("openvino"), OpenVinoBackend)
    assert "openvino" not in AUTO_ORDER
    assert get_backend("openvino", OvOptions(threads=1)).options.threads == 1
    with pytest.raises(BackendError, match="OvOptions"):
        get_backend("openvino", object())
    with pytest.raises(BackendError, match="numerics"):
        OpenVinoBackend(OvOptions(numerics="bogus"))


def test_missing_openvino_is_a_typed_error_with_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)   # import openvino -> ImportError
    assert not OpenVinoBackend().available()
    with pytest.raises(BackendError) as err:
        get_backend("openvino")
    assert "pip install" in str(err.value) and "openvino" in str(err.value)


def test_capability_has_no_onnxruntime_fused_ops():
    cap = openvino_capability()
    assert not [n for n in cap.ops if n.startswith("qlower_ort::")]
    assert "qlower::conv2d" in cap.ops and "qlower::requantize" in cap.ops


# ------------------------------------------------------------------------------ requantize
class Requant(torch.nn.Module):
    def __init__(self, acc_scale, out_scale, zp, qmin, qmax, dtype, axis):
        super().__init__()
        self.register_buffer("acc_scale", torch.tensor(acc_scale, dtype=torch.float32))
        self.args = (out_scale, zp, qmin, qmax, dtype, axis, "float")

    def forward(self, acc):
        return ops.requantize(acc, self.acc_scale, *self.args)


def tie_vector(channels: int) -> torch.Tensor:
    return edge_tie_vector(channels, small=2000, small_range=50000)


# the shared edge scales plus tiny multipliers and a random scale
EDGE_SCALES = BASE_EDGE_SCALES + [3.7e-5, 1.3e-3]


@pytest.mark.parametrize("dtype,zp,relu", [(U8, 0, False), (U8, 131, True), (S8, -3, False), (S8, 10, True)])
def test_requantize_bit_exact_on_ties_and_extremes(dtype, zp, relu):
    lo, hi = rng(dtype)
    ref, got, exe = compile_both(Requant(EDGE_SCALES, 1.0, zp, zp if relu else lo, hi, dtype, 1),
                                 tie_vector(len(EDGE_SCALES)))
    assert_all_on_openvino(exe)
    assert_equal(ref, got)
    qmin = zp if relu else lo
    assert int((ref == qmin).sum()) > 0 and int((ref == hi).sum()) > 0   # both saturations exercised


# ------------------------------------------------------------------------------ accumulating ops
class Conv(torch.nn.Module):
    def __init__(self, w, bias, x_zp, conv, one_d=False):
        super().__init__()
        self.register_buffer("w", w)
        self.register_buffer("w_zp", torch.zeros(w.shape[0], dtype=torch.int32))
        self.register_buffer("bias", bias)
        self.x_zp, self.conv, self.one_d = x_zp, conv, one_d

    def forward(self, x):
        return (ops.conv1d if self.one_d else ops.conv2d)(x, self.x_zp, self.w, self.w_zp, self.bias, *self.conv)


@pytest.mark.parametrize("dtype", [U8, S8])
@pytest.mark.parametrize("cfg", ["3x3", "64ch", "depthwise-stride2", "extreme"])
def test_conv2d_accumulator_bit_exact(dtype, cfg):
    """The int32 accumulator itself. "extreme": every product at its maximum, |sum| = 576*255*128
    > 2^24: OpenVINO accumulates in fp32 and would round it, so the capability refuses it (the
    conv runs in PyTorch, exact)."""
    g = torch.Generator().manual_seed(hash((str(dtype), cfg)) % 1000)
    lo, hi = rng(dtype)
    cin, cout, k, stride, groups = {"3x3": (3, 8, 3, 1, 1), "64ch": (64, 16, 3, 1, 1),
                                    "depthwise-stride2": (8, 8, 3, 2, 8), "extreme": (64, 4, 3, 1, 1)}[cfg]
    w = random_q((cout, cin // groups, k, k), S8, g)
    x = random_q((1, cin, 10, 10), dtype, g)
    x_zp = int(torch.randint(lo, hi + 1, (), generator=g))
    if cfg == "extreme":
        x, w, x_zp = torch.full_like(x, hi), torch.full_like(w, -128), lo
    bias = torch.randint(-3000, 3000, (cout,), generator=g, dtype=torch.int32)
    ref, got, exe = compile_both(Conv(w, bias, x_zp, ([stride] * 2, [1, 1], [1, 1], groups)), x)
    if cfg == "extreme":
        assert int(ref.abs().max()) > 2**24
        assert [c.backend for c in exe.clusters] == ["pytorch"] and "2^24" in exe.clusters[0].reason
    else:
        assert_all_on_openvino(exe)
    assert_equal(ref, got)


def test_conv1d_accumulator_bit_exact():
    g = torch.Generator().manual_seed(4)
    w, x = random_q((8, 16, 3), S8, g), random_q((2, 16, 20), U8, g)
    ref, got, exe = compile_both(Conv(w, torch.randint(-99, 99, (8,), dtype=torch.int32), 77,
                                      ([1], [1], [1], 1), one_d=True), x)
    assert_all_on_openvino(exe)
    assert_equal(ref, got)


@pytest.mark.parametrize("dtype", [U8, S8])
@pytest.mark.parametrize("k,case", [(24, "random"), (768, "random"), (3072, "extreme"), (3072, "large")])
def test_linear_accumulator_bit_exact(dtype, k, case):
    """The int32 accumulator itself. K = 3072 ("extreme": every product at its maximum, |sum|
    1e8; "large": products near it with arbitrary low bits, |sum| ~8e7, what fp32 would round):
    beyond 2^24 OpenVINO's fp32 accumulation rounds, so the linear is split over its input
    features into bounded linears whose int32 accumulators are added (split_accumulation.py) and
    stays on OpenVINO, exact. Was: refused, PyTorch ran it (BERT-base's FFN down-projections)."""
    g = torch.Generator().manual_seed(k)
    lo, hi = rng(dtype)
    w, x = random_q((16, k), S8, g), random_q((3, 4, k), dtype, g)
    x_zp = int(torch.randint(lo, hi + 1, (), generator=g))
    if case == "extreme":
        x, w, x_zp = torch.full_like(x, hi), torch.full_like(w, -128), lo
    elif case == "large":
        x = torch.randint(hi - 40, hi + 1, x.shape, generator=g).to(dtype)
        w, x_zp = torch.randint(-128, -88, w.shape, generator=g).to(S8), lo
    ref, got, exe = compile_both(Linear(w, torch.randint(-3000, 3000, (16,), generator=g, dtype=torch.int32), x_zp), x)
    if case != "random":
        assert int(ref.abs().max()) > 2**24
    if case == "large":   # odd sums beyond 2^24: not fp32 values, so any fp32 rounding would show
        assert int(((ref.abs() > 2**24) & (ref % 2 != 0)).sum()) > 0
    assert_all_on_openvino(exe)
    assert_equal(ref, got)


class Matmul(torch.nn.Module):
    def __init__(self, a_zp, b_zp):
        super().__init__()
        self.zps = (a_zp, b_zp)

    def forward(self, a, b):
        return ops.matmul(a, self.zps[0], b, self.zps[1])


@pytest.mark.parametrize("b_dtype", [U8, S8])
def test_activation_matmul_bit_exact(b_dtype):
    """K = 256 with worst-case bound 256 * 131 * 200 < 2^24: on OpenVINO, exact; K = 768: refused.
    s8 second operands included on CPUs without VNNI: OpenVINO accumulates in fp32, so ONNX
    Runtime's AVX2 refusal (its u8 x s8 pair sums saturate) is not inherited."""
    g = torch.Generator().manual_seed(9)
    a, b = random_q((2, 3, 5, 256), U8, g), random_q((2, 3, 256, 7), b_dtype, g)
    ref, got, exe = compile_both(Matmul(131, 5 if b_dtype == S8 else 200), a, b)
    assert_all_on_openvino(exe)
    assert_equal(ref, got)
    a, b = torch.full((1, 1, 768), 255, dtype=U8), torch.full((1, 768, 3), 0 if b_dtype == U8 else -128, dtype=b_dtype)
    ref, got, exe = compile_both(Matmul(0, 255 if b_dtype == U8 else 127), a, b)
    assert [c.backend for c in exe.clusters] == ["pytorch"] and "2^24" in exe.clusters[0].reason
    assert_equal(ref, got)


# ------------------------------------------------------------------------------ elementwise: exhaustive
class Binary(torch.nn.Module):
    def __init__(self, fn, args):
        super().__init__()
        self.fn, self.args = fn, args

    def forward(self, a, b):
        a_s, a_z, b_s, b_z, o_s, o_z, lo, hi, dt = self.args
        return self.fn(a, a_s, a_z, b, b_s, b_z, o_s, o_z, lo, hi, dt)


@pytest.mark.parametrize("name", ["add", "mul"])
@pytest.mark.parametrize("dtype", [U8, S8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_add_mul_bit_exact_on_all_65536_pairs(name, dtype, seed):
    """Every (a, b) pair of the 8-bit domain, random log-uniform qparams. No QLinearAdd here:
    DequantizeLinear x2 -> Add/Mul -> QuantizeLinear, the canonical definition."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = rng(dtype)

    def scale():
        return float(torch.exp(torch.empty(()).uniform_(-9, 0, generator=g)))

    def zp():
        return int(torch.randint(lo, hi + 1, (), generator=g))
    out_scale = scale() * (2 if name == "add" else scale())
    args = (scale(), zp(), scale(), zp(), out_scale, zp(), lo, hi, dtype)
    domain = torch.arange(lo, hi + 1).to(dtype)
    a, b = domain[:, None].expand(-1, 256).contiguous(), domain[None, :].expand(256, -1).contiguous()
    ref, got, exe = compile_both(Binary(getattr(ops, name), args), a, b)
    assert_all_on_openvino(exe)
    assert_equal(ref, got)
    onnx_model = onnx.load_from_string(exe.clusters[0].onnx)
    assert {n.domain for n in onnx_model.graph.node} <= {""}, "a non-standard op reached OpenVINO"


# ------------------------------------------------------------------------------ pass-through ops
class Pool(torch.nn.Module):
    def forward(self, x):
        return ops.max_pool2d(x, [3, 3], [2, 2], [1, 1], [1, 1], False)


class Mean(torch.nn.Module):
    def __init__(self, zp, keepdim, lo, hi):
        super().__init__()
        self.args = (zp, [2, 3], keepdim, lo, hi)

    def forward(self, x):
        return ops.mean(x, *self.args)


@pytest.mark.parametrize("dtype", [U8, S8])
def test_max_pool_and_mean_bit_exact(dtype):
    g = torch.Generator().manual_seed(3)
    lo, hi = rng(dtype)
    x = random_q((2, 16, 15, 15), dtype, g)
    ref, got, exe = compile_both(Pool(), x)
    assert_all_on_openvino(exe)
    assert_equal(ref, got)
    for keepdim, hw in ((True, 7), (False, 8), (True, 14)):   # n = 49 (odd), 64 (2^6): exact; 196: refused
        x = random_q((2, 64, hw, hw), dtype, g)
        # a tie if n even
        x[0, 0] = torch.tensor([lo, hi], dtype=dtype).repeat(hw * hw // 2 + 1)[:hw * hw].reshape(hw, hw)
        ref, got, exe = compile_both(Mean(int(torch.randint(lo, hi + 1, (), generator=g)), keepdim, lo, hi), x)
        if hw == 14:
            assert [c.backend for c in exe.clusters] == ["pytorch"] and "fp32(1/196)" in exe.clusters[0].reason
        else:
            assert_all_on_openvino(exe)
        assert_equal(ref, got)


# ------------------------------------------------------------------------------ quantize / dequantize
class Q(torch.nn.Module):
    def __init__(self, scale, zp, dtype):
        super().__init__()
        self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32))
        self.register_buffer("zp", torch.tensor(zp, dtype=torch.int32))
        self.dtype = dtype

    def forward(self, x):
        lo, hi = rng(self.dtype)
        return ops.quantize(x, self.scale, self.zp, lo, hi, self.dtype, None)


class DQ(Q):
    def forward(self, q):
        return ops.dequantize(q, self.scale, self.zp, None)


@pytest.mark.parametrize("dtype", [U8, S8])
@pytest.mark.parametrize("seed", [0, 1])
def test_dequantize_bit_exact_on_every_value(dtype, seed):
    """All 256 inputs. OpenVINO's own DequantizeLinear folds to q*s - zp*s (ulps off, DQ(zp) != 0);
    legalize.exact_dequantize's int32 subtraction is what runs, and must be exact."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = rng(dtype)
    scale = float(torch.exp(torch.empty(()).uniform_(-9, 0, generator=g)))
    zp = int(torch.randint(lo, hi + 1, (), generator=g))
    ref, got, exe = compile_both(DQ(scale, zp, dtype), torch.arange(lo, hi + 1).to(dtype))
    assert_all_on_openvino(exe)
    assert_equal(ref, got)


QUANTIZE_EDGES = [0.5, -0.5, 1.5, 2.5, -2.5, 3.5, 127.5, 128.5, float("inf"), float("-inf"), float("nan"),
                  1e9, -1e9, 0.0, -0.0, 0.49999997]


@pytest.mark.parametrize("dtype,zp", [(U8, 0), (U8, 128), (S8, -5)])
@pytest.mark.parametrize("scale", [1.0, 2.0**-7, 2.0**3])
def test_quantize_power_of_two_scale_bit_exact(dtype, zp, scale):
    """Ties to even, +-inf saturation, NaN -> qmin, zero point after rounding."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.tensor(QUANTIZE_EDGES) * scale, torch.randn(5000, generator=g) * scale * 100,
                   (torch.arange(-300, 300) + 0.5) * scale])
    ref, got, exe = compile_both(Q(scale, zp, dtype), x)
    assert_all_on_openvino(exe)
    assert_equal(ref, got)


def test_quantize_non_power_of_two_refused_canonical_and_declared_native():
    """Canonical profile: quantize with a scale whose reciprocal is inexact runs in PyTorch (exact).
    numerics='openvino': it runs in OpenVINO and the report declares the engine-native rounding;
    its deviation from canonical is at most 1 LSB."""
    g = torch.Generator().manual_seed(0)
    scale = 0.0123457
    x = torch.cat([(torch.arange(-300, 300) + 0.5) * scale, torch.randn(20000, generator=g) * scale * 60])
    ref, got, exe = compile_both(Q(scale, 11, U8), x)
    assert [c.backend for c in exe.clusters] == ["pytorch"] and "power-of-two" in exe.clusters[0].reason
    assert_equal(ref, got)
    ref, got, exe = compile_both(Q(scale, 11, U8), x, options=OvOptions(numerics="openvino"))
    assert_all_on_openvino(exe)
    assert any("engine-native" in n and "quantize" in n for n in exe.notes)
    assert int((ref.to(torch.int64) - got.to(torch.int64)).abs().max()) <= 1


# ------------------------------------------------------------------------------ zoo models
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_zoo_fp32_one_cluster_within_float_tolerance(name):
    entry = ZOO[name]
    model, x = entry.model().eval(), entry.inputs(1)
    cm = qlower.compile(model, x, backend="openvino")
    clusters = cm.report().clusters
    assert [(c.backend, c.status) for c in clusters] == [("openvino", "compiled")]
    with torch.no_grad():
        for seed in (1, 2):
            xs = entry.inputs(1, seed=seed)
            torch.testing.assert_close(cm(*xs), model(*xs), rtol=1e-4, atol=1e-5)


def test_zoo_cnn_int8_bit_exact_and_standard_onnx(quantized_zoo):
    """Every op of the lowered CNN is an integer op: OpenVINO equals the reference on every
    element; no com.microsoft op, no fused QLinearConv reaches OpenVINO."""
    entry, model, ep = quantized_zoo["cnn"]
    ref = qlower.compile(ep, entry.inputs(1), backend="reference")
    cm = qlower.compile(ep, entry.inputs(1), backend="openvino")
    clusters = cm.report().clusters
    assert [c.backend for c in clusters if c.status == "compiled"] == ["openvino"]
    onnx_model = onnx.load_from_string(next(c for c in clusters if c.backend == "openvino").onnx)
    types = {n.op_type for n in onnx_model.graph.node}
    assert {n.domain for n in onnx_model.graph.node} <= {""} and "ConvInteger" in types and "QLinearConv" not in types
    for seed in range(1, 9):
        xs = entry.inputs(1, seed=seed)
        assert torch.equal(cm(*xs), ref(*xs))


def test_zoo_transformer_int8_matches_reference(quantized_zoo):
    """Integer ops exact; the float ops between them (softmax, layer norm, gelu) are OpenVINO's
    float kernels, so outputs agree with the reference within float rounding."""
    entry, model, ep = quantized_zoo["transformer"]
    x = entry.inputs(1)
    ref = qlower.compile(ep, x, backend="reference")
    cm = qlower.compile(ep, x, backend="openvino")
    assert [c.backend for c in cm.report().clusters if c.status == "compiled"].count("openvino") >= 1
    torch.testing.assert_close(cm(*x), ref(*x), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------ fallback
def test_compile_failure_falls_back_per_cluster(monkeypatch, small_net):
    from qlower.backends.openvino import backend as ov_backend

    def broken(model_bytes, config):
        raise RuntimeError("synthetic OpenVINO compile failure")
    monkeypatch.setattr(ov_backend, "compile_onnx", broken)
    ov_backend._COMPILED.clear()
    x = (torch.randn(1, 3, 16, 16),)
    cm = qlower.compile(small_net, x, backend="openvino")
    clusters = cm.report().clusters
    assert clusters and all(c.status == "fallback" for c in clusters if c.backend == "openvino")
    assert "synthetic OpenVINO compile failure" in clusters[0].reason
    with torch.no_grad():
        torch.testing.assert_close(cm(*x), small_net(*x))


@pytest.mark.parametrize("activations, refused, integer_linears", [
    ("per-token", ("qlower::token_scale", "qlower::quantize_per_token", "qlower::dequantize_per_token_acc"), 2),
    ("dynamic", ("qlower::quantize_dynamic", "qlower::linear_dynamic"), 0),
])
def test_run_time_quantization_stays_in_pytorch_and_exact(activations, refused, integer_linears):
    """The run-time-scale ops (per-token or dynamic quantization, a linear multiplying by a
    run-time scale) are refused — OpenVINO's rewrites of division/multiplication by run-time
    values changed the outputs — and run in PyTorch; a per-token linear's integer GEMM between
    them still runs in OpenVINO; the model equals the reference."""
    from qlower.quantize import QuantConfig
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)).eval()
    x = torch.randn(2, 10, 64)
    ep = qlower.quantize(model, (x,), [(torch.randn(2, 10, 64),) for _ in range(2)],
                         QuantConfig(activations=activations))
    ov = qlower.compile(ep, (x,), backend="openvino")
    ref = qlower.compile(ep, (x,), backend="reference")
    report = ov.report()
    reasons = " ".join(str(c.reason) for c in report.fallbacks)
    for op in refused:
        assert f"{op}: OpenVINO rewrites" in reasons
    assert sum(c.ops.get("qlower::linear", 0) for c in report.compiled) == integer_linears
    for seed in range(3):
        xi = torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(seed)) * 3
        assert torch.equal(ov(xi), ref(xi))


def _quantize_scales(cm) -> list[float]:
    gm = cm.graph_module
    scales = []
    for n in gm.graph.nodes:
        if n.target == torch.ops.qlower.quantize.default:
            scales += getattr(gm, n.args[1].target).reshape(-1).tolist()
    return scales


def test_power_of_two_activation_scales_keep_the_cnn_in_one_exact_cluster():
    """Quantizing for openvino (canonical numerics) rounds every activation scale up to a power
    of two, which OpenVINO quantizes exactly: no quantize is refused, one cluster, and the
    outputs equal the reference backend on the same program."""
    import math
    entry = ZOO["cnn"]
    model, x, cal = entry.model(), entry.inputs(1), entry.calibration(4)
    ep = qlower.quantize(model, x, cal, "int8", backend="openvino")
    ov = qlower.compile(ep, x, backend="openvino")
    report = ov.report()
    assert len(report.compiled) == 1 and not report.fallbacks
    scales = _quantize_scales(ov)
    assert scales and all(math.frexp(s)[0] == 0.5 for s in scales)
    ref = qlower.compile(ep, x, backend="reference")
    for seed in range(3):
        xi = entry.inputs(1, seed=70 + seed)
        assert torch.equal(ov(*xi), ref(*xi))


def test_engine_native_numerics_keep_calibrated_scales():
    """Near miss: with numerics='openvino' (OpenVINO's own rounding, declared in the report)
    the calibrated scales are kept, not snapped."""
    import math
    entry = ZOO["cnn"]
    model, x, cal = entry.model(), entry.inputs(1), entry.calibration(4)
    cm = qlower.compile(model, x, quantize="int8", calibration=cal, backend="openvino",
                        backend_options=OvOptions(numerics="openvino"))
    scales = _quantize_scales(cm)
    assert scales and any(math.frexp(s)[0] != 0.5 for s in scales)
    assert any("engine-native numerics" in n for n in cm.report().notes)


def _gemm_note(cm) -> str:
    return next(n for n in cm.report().notes if n.startswith("OpenVINO runs"))


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_engine_native_hands_the_qdq_program_to_openvinos_int8_kernels(name):
    """numerics='openvino': LowerQDQ does not run (the cluster holds quantize/dequantize around
    float conv/linear, no qlower integer op), every conv/linear layer runs in u8 on the CPU plugin, the
    report declares the engine-native numerics, and the outputs stay close to the same program
    on the reference backend (not bit-exact: OpenVINO's own requantization)."""
    entry = ZOO[name]
    model, x, cal = entry.model(), entry.inputs(1), entry.calibration(4)
    ep = qlower.quantize(model, x, cal, "int8", backend="openvino")
    cm = qlower.compile(ep, x, backend="openvino", backend_options=OvOptions(numerics="openvino"))
    (cluster,) = cm.report().clusters
    assert cluster.backend == "openvino" and cluster.status == "compiled"
    assert "qlower::dequantize" in cluster.ops
    assert not [op for op in cluster.ops if op in ("qlower::linear", "qlower::conv2d", "qlower::requantize")]
    note = _gemm_note(cm)
    u8 = int(note.split(" in u8")[0].split(" ")[-1])
    layers = sum(isinstance(m, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv1d)) for m in model.modules())
    assert layers > 0 and u8 >= layers, note   # (OpenVINO keeps some activation x activation matmuls in f32)
    assert any("engine-native numerics (not canonical)" in n for n in cm.report().notes)
    ref = qlower.compile(ep, x, backend="reference")
    for seed in range(2):
        xi = entry.inputs(1, seed=80 + seed)
        got, want = cm(*xi), ref(*xi)
        cosine = torch.nn.functional.cosine_similarity(got.flatten().double(), want.flatten().double(), dim=0)
        assert cosine > 0.999, (name, float(cosine))


@pytest.mark.slow
def test_engine_native_save_load_round_trip(tmp_path):
    """An engine-native artifact keeps its options: loaded, it runs the Q/DQ program on
    OpenVINO's int8 kernels again and gives identical outputs."""
    entry = ZOO["cnn"]
    model, x = entry.model(), entry.inputs(1)
    cm = qlower.compile(model, x, quantize="int8", calibration=entry.calibration(2), backend="openvino",
                        backend_options=OvOptions(numerics="openvino"))
    cm.save(tmp_path / "m.pt2")
    loaded = qlower.load(tmp_path / "m.pt2")
    assert loaded.backend_options == OvOptions(numerics="openvino")
    assert "in u8" in _gemm_note(loaded) and any("engine-native" in n for n in loaded.report().notes)
    for seed in range(2):
        xi = entry.inputs(1, seed=90 + seed)
        assert torch.equal(cm(*xi), loaded(*xi))


def test_canonical_numerics_keep_integer_ops_which_openvino_runs_in_float():
    """Near miss: the default profile lowers to qlower's integer ops (bit-exact), which the CPU
    plugin executes with float arithmetic, and says so in the report."""
    entry = ZOO["cnn"]
    model, x, cal = entry.model(), entry.inputs(1), entry.calibration(4)
    cm = qlower.compile(model, x, quantize="int8", calibration=cal, backend="openvino")
    assert any(op == "qlower::conv2d" for c in cm.report().clusters for op in c.ops)
    assert "in u8" not in _gemm_note(cm) and "in i8" not in _gemm_note(cm)
    assert not any("engine-native" in n for n in cm.report().notes)


def test_engine_native_pipeline_hook_adapts_only_the_default_pipeline():
    """The backend's pipeline hook drops the integer lowering (and the integer LayerNorm, RMSNorm
    and softmax, which OpenVINO cannot run canonically) under numerics='openvino' only,
    and a user's explicit passes= are run as given (integer ops again)."""
    from qlower.passes import (IntegerLayerNorm, IntegerRMSNorm, IntegerSoftmax, LowerDynamicLinear,
                               LowerPerTokenLinear, LowerQDQ, default_pipeline)
    native = OpenVinoBackend(OvOptions(numerics="openvino")).pipeline(default_pipeline())
    dropped = (LowerQDQ, LowerPerTokenLinear, LowerDynamicLinear, IntegerLayerNorm, IntegerRMSNorm, IntegerSoftmax)
    assert not any(isinstance(p, dropped) for p in native)
    assert len(native) == len(default_pipeline()) - len(dropped)
    canonical = OpenVinoBackend().pipeline(default_pipeline())
    assert [type(p) for p in canonical] == [type(p) for p in default_pipeline()]
    entry = ZOO["cnn"]
    model, x, cal = entry.model(), entry.inputs(1), entry.calibration(2)
    cm = qlower.compile(model, x, quantize="int8", calibration=cal, backend="openvino",
                        backend_options=OvOptions(numerics="openvino"), passes=default_pipeline())
    assert any(op == "qlower::conv2d" for c in cm.report().clusters for op in c.ops)


def test_named_preset_uses_static_activations_on_openvino_explicit_config_respected():
    from qlower.quantize import QuantConfig
    backend = get_backend("openvino")
    config, note = backend.quant_config(QuantConfig.from_name("transformer"), preset=True)
    assert config.activations == "static" and "per-token" in note
    explicit = QuantConfig(activations="per-token")
    assert backend.quant_config(explicit, preset=False) == (explicit, None)
    assert not config.quantize_attention   # canonical numerics: SDPA stays one float op


def test_engine_native_preset_quantizes_attention_matmuls():
    """Engine-native presets decompose SDPA so OpenVINO runs its two matmuls in int8 (the fp32
    ones were the measured gap to NNCF); an explicit QuantConfig is taken as given."""
    from qlower.quantize import QuantConfig
    backend = get_backend("openvino", OvOptions(numerics="openvino"))
    config, note = backend.quant_config(QuantConfig.from_name("transformer"), preset=True)
    assert config.quantize_attention and config.quantize_activation_matmul and "attention matmuls quantized" in note
    assert config.symmetric_activation_matmul
    explicit = QuantConfig()
    assert backend.quant_config(explicit, preset=False) == (explicit, None)


@pytest.mark.slow
def test_kv_cache_step_whose_size_inputs_openvino_drops_runs_in_openvino():
    """OpenVINO's ONNX frontend drops graph inputs nothing reads (a KV-cache decode step passes
    sizes its cluster no longer needs): arguments are fed by name, not position (fed by position,
    every call fails with a numpy reshape error and the cluster falls back to PyTorch at run time)."""
    from qlower import zoo
    entry = zoo.get("hf-llama-kv")
    model, x = entry.model(), entry.inputs(1)
    cm = qlower.compile(model, x, backend="openvino")
    clusters = [m for m in cm._executable.module.modules() if hasattr(m, "feed")]
    assert any(c.feed is not None for c in clusters)          # the case exists in this program
    got, want = cm(*x), entry.model()(*entry.inputs(1))
    assert not cm.report().fallbacks
    torch.testing.assert_close(got[0] if isinstance(got, tuple) else got,
                               want[0] if isinstance(want, tuple) else want, rtol=1e-4, atol=1e-4)


def _matmul_operand_qparams(config):
    """(dtype, zero point) of each operand of each matmul in a quantized SDPA block."""
    import torch.nn.functional as F

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(8, 8) for _ in range(3))

        def forward(self, x):
            return F.scaled_dot_product_attention(*(p(x).unsqueeze(1) for p in (self.q, self.k, self.v)))

    torch.manual_seed(0)
    ep = qlower.quantize(Attention(), (torch.randn(2, 5, 8),), [(torch.randn(2, 5, 8),) for _ in range(3)],
                         config=config)
    return [[(dq.args[5], dq.args[2]) for dq in n.args[:2]]
            for n in ep.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.matmul.default]


def test_symmetric_activation_matmul_gives_int8_zero_point_free_attention_operands():
    """symmetric_activation_matmul (set by the engine-native OpenVINO presets): q, k and v enter
    their matmuls int8 with zero point 0, which OpenVINO's low-precision transformations need to
    run the attention in int8 (with uint8-asymmetric ones BERT-base's attention ran as an f32 MHA
    snippet); the softmax output stays uint8 (non-negative, zero point 0). Off: the activation
    dtype, asymmetric."""
    from qlower.quantize import QuantConfig
    (qk, pv) = _matmul_operand_qparams(QuantConfig(quantize_attention=True, symmetric_activation_matmul=True))
    assert qk == [(torch.int8, 0), (torch.int8, 0)]
    assert pv[0] == (torch.uint8, 0) and pv[1] == (torch.int8, 0)
    (qk, pv) = _matmul_operand_qparams(QuantConfig(quantize_attention=True))
    assert all(dtype == torch.uint8 for dtype, _ in qk + pv) and any(zp != 0 for _, zp in qk + pv)


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_sizes_across_a_refused_op_stay_inside_the_clusters(monkeypatch, backend):
    """Batch and sequence dynamic, an op between two clusters refused: a size the first cluster
    computes and the second reads raises a raw AttributeError on OpenVINO (zoo transformer
    int8) or runs the first cluster in PyTorch, and a cluster taking a size
    cannot be re-captured at all (the T5 encoder: "'SymInt' object has no attribute
    'shape'"). So each size is computed where it is read (cluster_sizes.py): both clusters
    compile, and the outputs are right at another size."""
    monkeypatch.setenv("QLOWER_OP_DENYLIST", "aten::cumsum")

    class SizesAcrossARefusedOp(torch.nn.Module):
        def forward(self, x):
            n = x.shape[1]
            z = torch.cumsum(torch.relu(x) * 2, 1)
            return (z.reshape(x.shape[0] * n, -1) + 1).relu()
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=16)
    model = SizesAcrossARefusedOp()
    cm = qlower.compile(model, (torch.randn(2, 5, 4),), backend=backend, dynamic_shapes=({0: batch, 1: seq},))
    report = cm.report()
    assert len(report.compiled) == 2, str(report)
    assert [c.backend for c in report.fallbacks] == ["pytorch"], str(report)
    assert "cumsum" in str(report.fallbacks[0].ops), str(report)
    x = torch.randn(3, 7, 4)
    torch.testing.assert_close(cm(x), model(x))


# ----------------------------------------------------------------------------- NaN and inf
class _Overflowing(torch.nn.Module):
    """An inf born inside the cluster (x * 1e30 * 1e30 overflows), then `kind`."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        y = x * 1e30 * 1e30
        if self.kind == "softmax":
            return torch.softmax(y, -1)
        if self.kind == "log_softmax":
            return torch.log_softmax(y, -1)
        return qlower.blockops.ops.attention(y, x, x, None, self.kind == "causal", None)


@pytest.mark.parametrize("kind", ["softmax", "log_softmax", "attention", "causal"])
def test_nan_born_inside_a_cluster_stays_nan_as_in_eager(kind):
    """OpenVINO's Softmax keeps a row's +inf/NaN to its own element (0 elsewhere) and its fused
    attention returns 0: the guarded Softmax (legalize.ieee_softmax) and the decomposed attention
    give eager's NaN rows; finite rows stay bit-identical to the unguarded kernel's."""
    torch.manual_seed(0)
    x = torch.randn(1, 2, 4, 3)
    x[0, 0, 1, 0] = 5.0   # row 1 of head 0 overflows to +inf
    m = _Overflowing(kind)
    cm = qlower.compile(m, (x,), backend="openvino")
    assert not cm.report().fallbacks
    if kind in ("attention", "causal"):
        assert "decomposed qlower::attention (openvino lacks it)" in str(cm.report())
    want, got = m(x), cm(x)
    assert torch.isnan(want).any()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    finite = ~torch.isnan(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-6)


def test_call_with_nan_input_runs_the_cluster_in_pytorch_and_says_so():
    """max-pool skips NaN in OpenVINO (measured: -3.4e38): a call whose cluster input holds
    NaN/inf runs that cluster in PyTorch; finite calls stay on OpenVINO."""
    m = torch.nn.MaxPool2d(2)
    x = torch.randn(1, 2, 4, 4)
    cm = qlower.compile(m, (x,), backend="openvino")
    assert torch.equal(cm(x), m(x))
    bad = x.clone()
    bad[0, 0, 0, 0] = float("nan")
    assert torch.isnan(cm(bad)[0, 0, 0, 0]) and torch.isnan(m(bad)[0, 0, 0, 0])
    assert cm(x).isfinite().all()
    info = cm.report().compiled[0]
    assert info.nonfinite_calls == 1 and info.status == "compiled"
    assert "1 call(s) with NaN/inf inputs ran in PyTorch" in str(cm.report())


# ----------------------------------------------------------------- int64 computed in int32
class Int64Moves(torch.nn.Module):
    def forward(self, x):
        return x.reshape(-1), x + 1, x.cumsum(-1), (x * 3).sum(-1)


class Int64Variance(torch.nn.Module):
    """A LayerNorm's integer variance over uint8 rows: N * sum(d^2) - sum(d)^2 leaves int32."""

    def forward(self, q):
        d = q.to(torch.int64) - 3
        return 768 * (d * d).sum(-1, keepdim=True) - d.sum(-1, keepdim=True) ** 2


def _equal(got, want):
    return all(torch.equal(g, w) for g, w in zip(got if isinstance(got, tuple) else (got,),
                                                   want if isinstance(want, tuple) else (want,)))


def test_int64_inputs_beyond_the_checked_bound_run_in_pytorch_not_wrapped():
    """OpenVINO's CPU plugin computes int64 in int32 (openvinotoolkit/openvino#35823): before, an
    input of 5e9 came back from a reshape as 705032704, silently. Small values run in OpenVINO."""
    small = torch.tensor([[5, 7, -3, 2]]) * 100000
    cm = qlower.compile(Int64Moves(), (small,), backend="openvino")
    assert [c.status for c in cm.report().clusters] == ["compiled"]
    assert _equal(cm(small), Int64Moves()(small)) and not cm.report().clusters[0].int64_overflow_calls
    big = torch.tensor([[5_000_000_000, 7, -3_000_000_000, 2]])
    assert _equal(cm(big), Int64Moves()(big))
    assert cm.report().clusters[0].int64_overflow_calls == 1
    assert "int64 values that could leave int32 ran in PyTorch" in str(cm.report())


def test_int64_arithmetic_that_can_leave_int32_runs_in_pytorch():
    q = torch.randint(0, 256, (4, 768), dtype=torch.uint8)
    cm = qlower.compile(Int64Variance(), (q,), backend="openvino")
    want = Int64Variance()(q)
    assert int(want.max()) > 2 ** 31 and _equal(cm(q), want)
    cluster = next(c for c in cm.report().clusters if c.status == "compiled")
    assert cluster.int64_overflow_calls == 1   # the variance of these rows leaves int32: PyTorch ran it
    small = torch.randint(0, 4, (4, 768), dtype=torch.uint8)   # here it stays inside: OpenVINO runs it
    assert _equal(cm(small), Int64Variance()(small)) and cluster.int64_overflow_calls == 1


def test_int64_bounds_follow_the_arithmetic():
    from qlower.backends.openvino.int64_bounds import INT32_MAX, Int64Bounds, RangeCheck, bounded_op

    class Positions(torch.nn.Module):
        def forward(self, ids, mask):
            pos = mask.cumsum(-1) - 1          # HF-style position ids: bounded by the sequence length
            return ids + pos, ids * ids, (pos * mask).float(), torch.min(ids, torch.full_like(ids, 31))

    ids = torch.randint(0, 1000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    seq = torch.export.Dim("seq", max=512)
    gm = torch.export.export(Positions(), (ids, mask), dynamic_shapes=({1: seq}, {1: seq})).module()
    by_name = {n.name: n for n in gm.graph.nodes}
    bounds = Int64Bounds(lambda n: {"ids": 999.0, "mask": 1.0}.get(n.name))
    cumsum = next(n for n in gm.graph.nodes if "cumsum" in n.name)
    assert bounds.of(cumsum) == 512                   # the declared Dim max bounds the sum of a 0/1 mask
    muls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.mul.Tensor]
    assert sorted(bounds.of(m) for m in muls) == [513 * 1, 999 * 999]
    assert all(bounded_op(n) for n in gm.graph.nodes if n.op == "call_function")
    check = RangeCheck(gm, {})
    assert check([ids, mask]) and check([ids, mask])          # the second call: monotone shortcut
    big = torch.full((2, 16), 50_000)                         # ids * ids = 2.5e9 > int32
    assert not check([big, mask]) and 50_000 ** 2 > INT32_MAX
    assert by_name["ids"].op == "placeholder"


def test_float_to_int64_cast_is_refused_on_openvino():
    class Cast(torch.nn.Module):
        def forward(self, x):
            return (x * 1e10).long() + 1

    x = torch.randn(4, 8)
    cm = qlower.compile(Cast(), (x,), backend="openvino")
    assert torch.equal(cm(x), Cast()(x))
    assert any("cannot bound" in (c.reason or "") for c in cm.report().fallbacks)


_C, _W = torch.randn(2, 2) * 100, torch.randn(5, 5, 2, 2)
_WRONG_IN_OPENVINO = {   # (function, input, reason fragment): each answers wrongly if compiled
    "sort": (lambda x: torch.sort(x), torch.randn(100), "TopK breaks ties"),
    "irfft": (lambda x: torch.fft.irfft(x), torch.randn(5, 10, 4), "DFT"),
    "upsample_aa": (lambda x: torch.nn.functional.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True),
                    torch.randn(1, 2, 8, 8), "antialiased"),
    # (every random draw stays in PyTorch, 0-d or not)
    "randn_like_0d": (lambda x: torch.randn_like(x[0, 0]) * 0 + x[0, 0], torch.randn(2, 3), "PyTorch's generator"),
    "mul_into_padded_conv": (lambda x: torch.nn.functional.conv2d(x * _C, _W, padding=1), torch.randn(2, 5, 2, 2),
                             "spatially varying constant"),
}


def test_constant_multiplies_openvino_fuses_rightly_stay_in_openvino():
    """Near misses of mul_into_padded_conv (from an OpenVINO fuzz failure off
    by 2.4e4): a per-channel constant, no padding, x * x — one cluster, eager's values."""
    from conftest import Fn
    per_channel = torch.randn(5, 1, 1) * 100
    x = torch.randn(2, 5, 2, 2)
    for fn in (lambda x: torch.nn.functional.conv2d(x * per_channel, _W, padding=1),
               lambda x: torch.nn.functional.conv2d(x * _C, _W),
               lambda x: torch.nn.functional.conv2d(x * x, _W, padding=1)):
        cm = qlower.compile(Fn(fn), (x,), backend="openvino")
        assert len(cm.report().compiled) == 1 and not cm.report().fallbacks, str(cm.report())
        torch.testing.assert_close(cm(x), fn(x), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("case", sorted(_WRONG_IN_OPENVINO))
def test_ops_measured_wrong_in_openvino_run_in_pytorch(case):
    """Wrong on openvino in PyTorch's OpInfo samples: a sort via
    TopK (ties in no fixed order), inverse real FFTs (last dim lost), antialiased upsampling,
    0-d random draws (come back 1-d); in its fuzz run:
    a spatially varying constant multiply into a padded convolution. Refused
    up front, with the reason; eager's answer — to the bit where PyTorch runs all of it, to float
    tolerance where OpenVINO runs the rest (mul_into_padded_conv's conv: OpenVINO's AVX2 conv
    sums in another order, 1e-4 off at values ~15 on a Zen 1, in CI)."""
    from conftest import Fn
    fn, x, reason = _WRONG_IN_OPENVINO[case]
    torch.manual_seed(0)
    cm = qlower.compile(Fn(fn), (x,), backend="openvino")
    assert any(reason in (c.reason or "") for c in cm.report().fallbacks), str(cm.report())
    tolerance = dict(rtol=1e-4, atol=1e-3) if cm.report().compiled else {}
    torch.manual_seed(1)
    got = cm(x)
    torch.manual_seed(1)
    want = fn(x)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, **tolerance)


class _GridSampleBetweenLinears(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3)

    def forward(self, x):
        image = torch.relu(self.a(x)).reshape(1, 1, 2, 4)
        sampled = torch.nn.functional.grid_sample(image, torch.zeros(1, 2, 2, 2), mode="bicubic", align_corners=True)
        return self.b(sampled.reshape(1, 4) * 2)


def test_a_node_the_cpu_plugin_rejects_runs_alone_in_pytorch(caplog, monkeypatch):
    """The plugin's ONNX frontend rejects this GridSample ("While validating ONNX node
    '<Node(GridSample): node_grid_sampler>'"): without the retry the whole cluster runs in PyTorch. The
    error names the node; the ATen op behind it is refused and the graph clustered again: two
    OpenVINO clusters around it, no warning about the retried round, eager's values. (The
    rejection is torchlib's opset-16 mode name under opset 23; `opset_changes`
    renames it and OpenVINO runs GridSample right, so the test keeps the opset-16
    name to get the plugin's real rejection.)"""
    import logging
    from qlower.onnx import opset_changes
    monkeypatch.setattr(opset_changes, "_GRID_SAMPLE_MODES", {})
    torch.manual_seed(0)
    model, x = _GridSampleBetweenLinears().eval(), torch.randn(2, 4)
    with caplog.at_level(logging.WARNING):
        cm = qlower.compile(model, (x,), backend="openvino")
    report = cm.report()
    assert len(report.compiled) == 2 and [list(c.ops) for c in report.fallbacks] == [["grid_sampler"]], str(report)
    assert "OpenVINO's CPU plugin rejects its translation" in report.fallbacks[0].reason
    assert not [r for r in caplog.records if "fell back" in r.getMessage()]
    torch.testing.assert_close(cm(x), model(x))


def test_a_rejection_naming_no_node_of_the_cluster_refuses_nothing():
    """Near miss: the op types OpenVINO names belong to no node torch.onnx maps back to a node
    of the cluster (hstack's SequenceMap sits in a function body of its decomposition): the
    cluster falls back whole, as before."""
    from qlower.backends.openvino.backend import rejected_nodes
    model, x = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval(), torch.randn(2, 4)
    sub = torch.export.export(model, (x,)).module()
    onnx_bytes = qlower.compile(model, (x,), backend="onnxruntime").report().clusters[0].onnx
    assert rejected_nodes(RuntimeError("No conversion rule found for operations: SequenceMap-23, util::SequenceAt"),
                          onnx_bytes, sub) == {}


def test_data_dependent_sizes_and_order_statistics_stay_in_pytorch():
    """What onnxruntime runs and OpenVINO is not verified on: masked_select (a size from the
    values) and segment_reduce (its ReduceMax of nothing is -3.4e38), and median / kthvalue /
    mode (no translation), are refused with their reasons, and the answers are eager's."""
    from conftest import Fn
    fn = lambda x, m: (torch.masked_select(x, m), torch.median(x, 1), torch.kthvalue(x, 2, 1), torch.mode(x.round(), 1),
                       torch.segment_reduce(x[0], "max", lengths=torch.tensor([0, 2, 2])))
    x, m = torch.randn(3, 4), torch.tensor([True, False, True, True])
    cm = qlower.compile(Fn(fn), (x, m), backend="openvino")
    reasons = {op: c.reason for c in cm.report().fallbacks for op in c.ops}
    assert "data-dependent" in reasons["masked_select"]
    assert {"median", "kthvalue", "mode"} <= set(reasons)
    assert "-3.4e38" in reasons["segment_reduce"]   # an empty segment's max: eager -inf
    for got, want in zip(torch.utils._pytree.tree_leaves(cm(x, m)), torch.utils._pytree.tree_leaves(fn(x, m))):
        assert torch.equal(got, want)


def test_float64_values_stay_in_pytorch_where_openvino_would_round_them():
    """OpenVINO's CPU plugin holds float64 as float32: a reshape / cat / transpose and a product
    of float64 values came back rounded to float32 (1.2e-7 and 4e-7 off), silently. Nodes with
    float64 values are refused with that reason; the answers are eager's to the last bit, and a
    float32 model beside it still compiles."""
    from conftest import Fn
    fn = lambda x: (torch.cat([x.reshape(8, 2), x.reshape(8, 2)]).t(), (x @ x) * 0.1 + torch.exp(x))
    x = torch.randn(4, 4, dtype=torch.float64)
    cm = qlower.compile(Fn(fn), (x,), backend="openvino")
    report = cm.report()
    assert not report.compiled and report.fallbacks
    assert all("float64 in float32" in c.reason for c in report.fallbacks)
    for got, want in zip(cm(x), fn(x)):
        assert got.dtype == torch.float64 and torch.equal(got, want)
    assert len(qlower.compile(Fn(fn), (x.float(),), backend="openvino").report().compiled) == 1


def test_bfloat16_values_stay_in_pytorch():
    """onnxruntime crosses a bfloat16 boundary in float32; the OpenVINO runner had no such crossing
    ("Got unsupported ScalarType BFloat16" at the first call): bfloat16 nodes are refused with
    their reason, the answers eager's."""
    from conftest import Fn
    fn = lambda x: (x.bfloat16(), x * 2)
    x = torch.randn(6)
    cm = qlower.compile(Fn(fn), (x,), backend="openvino")
    reasons = [c.reason for c in cm.report().fallbacks]
    assert reasons and all("bfloat16" in r for r in reasons)
    for got, want in zip(cm(x), fn(x)):
        assert got.dtype == want.dtype and torch.equal(got, want)
