"""Per-token dynamic activation quantization (QuantConfig(activations="per-token")): the
numerics (numerics.py), the Q/DQ program it produces, and bit-exactness of onnxruntime against
the reference backend on both CPU formulations (the passes' own tests:
tests/passes/test_lower_per_token.py, tests/passes/onnxruntime/test_fuse_per_token.py)."""
import pytest
import torch

import qlower
from qlower import numerics
from qlower.quantize import QuantConfig

from conftest import skip_numerics_unless_exact_here
from qdq_models import Mlp, wide_calibration as _calibration, count_nodes as _count

PER_TOKEN = QuantConfig(activations="per-token")
Q = torch.ops.qlower


# ------------------------------------------------------------------------------ numerics
def test_scale_is_row_max_over_127_and_never_zero():
    tiny = 2.0 ** -149
    x = torch.tensor([[1.0, -254.0, 3.0], [0.0, 0.0, 0.0], [0.5, 0.25, -0.125], [0.0, 63 * tiny, 0.0],
                      [0.0, -200 * tiny, 0.0]])
    s = numerics.per_token_scale(x)
    assert s.shape == (5, 1)
    assert s[0, 0].item() == 2.0
    assert s[1, 0].item() == tiny == s[3, 0].item()         # would be 0: the smallest positive fp32
    assert s[2, 0].item() == torch.tensor(0.5, dtype=torch.float32).div(127).item()
    assert s[4, 0].item() == 2 * tiny                          # 200/127 units rounds to 2
    q = numerics.quantize_per_token(x, s).to(torch.int32) - 128
    assert q[1].tolist() == [0, 0, 0] and q[3].tolist() == [0, 63, 0] and q[4].tolist() == [0, -100, 0]


def test_quantize_is_round_half_even_offset_128_saturating():
    s = torch.tensor([[1.0]])
    x = torch.tensor([[0.5, 1.5, 2.5, -0.5, -1.5, 127.0, -127.0, -127.5, -128.0, 200.0, -200.0]])
    q = numerics.quantize_per_token(x, s)
    assert q.dtype == torch.uint8
    assert (q.to(torch.int32) - 128).tolist() == [[0, 2, 2, 0, -2, 127, -127, -128, -128, 127, -128]]
    # the row maximum always lands on +-127, never on the unused code 0 (-128)
    x = torch.randn(64, 33) * torch.rand(64, 1) * 50
    q = numerics.quantize_per_token(x, numerics.per_token_scale(x))
    assert int(q.min()) >= 1
    assert ((q.to(torch.int32) - 128).abs().amax(-1) == 127).all()


def test_dequantize_error_is_at_most_half_a_step_per_row():
    x = torch.randn(16, 40) * torch.logspace(-3, 3, 16).reshape(-1, 1)
    s = numerics.per_token_scale(x)
    err = (numerics.dequantize_per_token(numerics.quantize_per_token(x, s), s) - x).abs()
    assert (err <= s * 0.5 * (1 + 1e-6)).all()


def test_only_a_subnormal_scale_reaches_minus_128():
    """The row maximum of a normal row lands on +-127; a subnormal s_t is inexact (here 190
    units of 2^-149 over 127 rounds to 1 unit), so x / s_t = -190 saturates at -128."""
    x = torch.full((1, 4), -190 * 2.0 ** -149)
    s = numerics.per_token_scale(x)
    assert s.item() == 2.0 ** -149
    assert (numerics.quantize_per_token(x, s).to(torch.int32) - 128).tolist() == [[-128] * 4]


def test_accumulator_is_scaled_per_channel_then_per_token():
    g = torch.Generator().manual_seed(0)
    acc = torch.randint(-2 ** 20, 2 ** 20, (64, 32), generator=g, dtype=torch.int32)
    st, sw = torch.rand(64, 1, generator=g) / 127, torch.rand(32, generator=g) / 127
    y = numerics.dequantize_per_token_accumulator(acc, st, sw)
    assert torch.equal(y, (acc.float() * sw) * st)
    # the order is part of the contract: the other association differs in the last bit
    assert (y != acc.float() * (st * sw)).sum() > 100


# ------------------------------------------------------------------------------ models
class ConvThenLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 4 * 4, 8)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def test_program_quantizes_each_linear_input_per_token_and_leaves_conv_static():
    torch.manual_seed(0)
    ep = qlower.quantize(ConvThenLinear().eval(), (torch.randn(2, 3, 6, 6),), _calibration((2, 3, 6, 6)), PER_TOKEN)
    gm = ep.graph_module
    assert _count(gm, Q.quantize_per_token.default) == 1      # the linear's input only
    linear = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default)
    assert linear.args[0].target == Q.dequantize_per_token.default
    conv = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.conv2d.default)
    assert conv.args[0].target == torch.ops.quantized_decomposed.dequantize_per_tensor.default


class Qkv(torch.nn.Module):
    """Three projections of one activation (attention's q/k/v) and one of another."""
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(16, 16) for _ in range(4))

    def forward(self, x):
        h = self.q(x) * self.k(x) + self.v(x)
        return self.o(torch.relu(h))


def test_linears_reading_one_activation_share_its_per_token_quantization():
    """q/k/v read x: one token_scale/quantize for the three (each copy costs ~10 ONNX Runtime
    nodes); o reads another activation (relu's output): its own. After lowering, ONNX Runtime
    still equals the reference bit for bit, and the lowered program the Q/DQ program."""
    torch.manual_seed(0)
    model, x = Qkv().eval(), (torch.randn(2, 5, 16),)
    ep = qlower.quantize(model, x, _calibration((2, 5, 16)), PER_TOKEN)
    gm = ep.graph_module
    scales = [n for n in gm.graph.nodes if n.target == Q.token_scale.default]
    assert _count(gm, Q.quantize_per_token.default) == 2
    assert [n.args[0].op for n in scales] == ["placeholder", "call_function"]   # x, then relu(h)
    projections = [n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default][:3]
    assert len({p.args[0] for p in projections}) == 1
    ref = qlower.compile(ep, x, backend="reference")
    ort = qlower.compile(ep, x, backend="onnxruntime")
    assert ort.report().rewrites["linear -> linear (per-token)"] == 4
    z = (torch.randn(2, 5, 16) * 3,)
    assert torch.equal(ort(*z), ref(*z))
    torch.testing.assert_close(ref(*z), ep.module()(*z), rtol=1e-5, atol=1e-5)


def test_static_config_has_no_per_token_ops():
    torch.manual_seed(0)
    ep = qlower.quantize(Mlp().eval(), (torch.randn(3, 32),), _calibration((3, 32)), QuantConfig())
    assert _count(ep.graph_module, Q.token_scale.default) == 0


def test_unknown_activations_setting_is_a_typed_error():
    with pytest.raises(qlower.QlowerError, match="per-token"):
        QuantConfig(activations="per-row")
    with pytest.raises(qlower.QlowerError, match="per_token_weight_bits"):
        QuantConfig(per_token_weight_bits=4)


def _weight_ranges(ep) -> dict[str, tuple[int, int]]:
    """The integer range of each per-channel weight, by the op that reads it ('conv2d', 'linear')."""
    out = {}
    for n in ep.graph_module.graph.nodes:
        if n.target == torch.ops.quantized_decomposed.dequantize_per_channel.default and n.args[6] is torch.int8:
            user = next(iter(n.users))
            out[str(user.target).split(".")[-2]] = (n.args[4], n.args[5])
    return out


def test_per_token_weight_bits_apply_to_per_token_linears_only():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 6)
    ep = qlower.quantize(ConvThenLinear().eval(), (x,), _calibration((2, 3, 6, 6)),
                         QuantConfig(activations="per-token", weight_bits=7, per_token_weight_bits=8))
    assert _weight_ranges(ep) == {"conv2d": (-63, 63), "linear": (-127, 127)}
    # near miss: a static config ignores it (its linears are not per-token)
    ep = qlower.quantize(ConvThenLinear().eval(), (x,), _calibration((2, 3, 6, 6)),
                         QuantConfig(weight_bits=7, per_token_weight_bits=8))
    assert _weight_ranges(ep) == {"conv2d": (-63, 63), "linear": (-63, 63)}


def test_onnxruntime_preset_without_vnni_keeps_8_bit_weights_in_per_token_linears(monkeypatch):
    """The `transformer` preset on a CPU without VNNI: 7-bit weights where ONNX Runtime's fused
    u8 x s8 kernels need them (the static conv), 8-bit ones in the per-token linear (u8 x u8
    there, exact: 7 bits cost SmolLM2-135M 6.6 dB). Equal to the reference bit for bit (the
    non-VNNI form is exact on every CPU). With VNNI: 8 bits everywhere."""
    from qlower.core import cpu
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 6)
    monkeypatch.setattr(cpu, "has_vnni", lambda: False)
    ep = qlower.quantize(ConvThenLinear().eval(), (x,), _calibration((2, 3, 6, 6)), "transformer",
                         backend="onnxruntime")
    assert _weight_ranges(ep) == {"conv2d": (-63, 63), "linear": (-127, 127)}
    ort, ref = (qlower.compile(ep, (x,), backend=b) for b in ("onnxruntime", "reference"))
    assert "MatMulIntegerToFloat" in _onnx_ops(ort) and not ort.report().fallbacks
    for i in range(4):
        xi = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(i)) * (10.0 ** (i - 2))
        assert torch.equal(ort(xi), ref(xi))
    cm = qlower.compile(ConvThenLinear().eval(), (x,), quantize="transformer", calibration=_calibration((2, 3, 6, 6)),
                        backend="onnxruntime")
    assert any(n.startswith("7-bit weights outside per-token linears") for n in cm.report().notes), cm.report().notes
    monkeypatch.setattr(cpu, "has_vnni", lambda: True)
    ep = qlower.quantize(ConvThenLinear().eval(), (x,), _calibration((2, 3, 6, 6)), "transformer",
                         backend="onnxruntime")
    assert _weight_ranges(ep) == {"conv2d": (-127, 127), "linear": (-127, 127)}


# ------------------------------------------------------------------------------ onnxruntime
@pytest.mark.parametrize("bits", [8, 7])
def test_onnxruntime_bit_exact_against_reference(vnni, bits):
    """Integer ops and the per-token quantization between them (relu is exact in both engines,
    so every output element must be equal), on both CPU formulations."""
    torch.manual_seed(1)
    model, x = Mlp().eval(), torch.randn(2, 7, 32)
    cfg = QuantConfig(activations="per-token", weight_bits=bits)
    cal = _calibration((2, 7, 32))
    ep = qlower.quantize(model, (x,), cal, cfg)
    ref = qlower.compile(ep, (x,), backend="reference")
    ort = qlower.compile(ep, (x,), backend="onnxruntime")
    assert not ort.report().fallbacks
    assert ort.report().rewrites["linear -> linear (per-token)"] == 2
    skip_numerics_unless_exact_here(vnni, full_range_weights=bits == 8)
    for i in range(6):
        xi = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(i)) * (10.0 ** (i - 3))
        assert torch.equal(ort(xi), ref(xi))


def _onnx_ops(cm) -> list[str]:
    import onnx
    return [n.op_type for c in cm.report().compiled for n in onnx.load_from_string(c.onnx).graph.node]


@pytest.mark.parametrize("bits", [8, 7])
def test_onnxruntime_form_is_one_quantize_and_one_fused_gemm_per_linear(vnni, bits):
    """Per activation the scale in four nodes (Abs, ReduceMax, Div, Max: no Equal/Where guard)
    and one blocked QuantizeLinear (no Div/Max over the activation); per linear one
    MatMulIntegerToFloat taking the token scale as its per-row A_scale (no Mul, no Cast, no
    [rows, cols] scale product)."""
    torch.manual_seed(5)
    model, x = Mlp().eval(), torch.randn(2, 7, 32)
    ep = qlower.quantize(model, (x,), _calibration((2, 7, 32)), QuantConfig(activations="per-token", weight_bits=bits))
    ops = _onnx_ops(qlower.compile(ep, (x,), backend="onnxruntime"))
    assert ops.count("MatMulIntegerToFloat") == 2 and "MatMulInteger" not in ops and "Cast" not in ops, ops
    assert ops.count("QuantizeLinear") == 2 and ops.count("Div") == ops.count("Max") == 2, ops
    assert "Where" not in ops and "Equal" not in ops and "Mul" not in ops, ops


@pytest.mark.parametrize("shape", [(1, 1, 32), (3, 1, 32), (1, 32), (5, 32), (32,)])
def test_onnxruntime_row_scale_in_the_gemm_is_exact_for_single_rows(shape):
    """A_scale of one element would be folded into the per-column multiplier (s_t * s_w, a
    rounding the numerics do not have): a single row in a rank >= 2 input keeps its [.., 1, 1]
    scale apart; a 1-D input (one row, scale [1]) keeps the Mul after the GEMM."""
    torch.manual_seed(7)
    model, x = Mlp(bias=True).eval(), torch.randn(*shape)
    ep = qlower.quantize(model, (x,), _calibration(shape), PER_TOKEN)
    ort, ref = (qlower.compile(ep, (x,), backend=b) for b in ("onnxruntime", "reference"))
    assert not ort.report().fallbacks
    assert ("Mul" in _onnx_ops(ort)) == (len(shape) == 1)
    for i in range(20):
        xi = torch.randn(*shape, generator=torch.Generator().manual_seed(i)) * (10.0 ** (i % 7 - 3))
        assert torch.equal(ort(xi), ref(xi))


def test_ort_fusion_with_row_scales_stays_off():
    """ONNX Runtime's MatMulIntegerToFloatFusion turns MatMulInteger -> Cast -> Mul(row scales)
    into a kernel that uses only the first scale; qlower's sessions disable it. This pins the
    option and checks a model whose rows have very different scales."""
    from qlower.backends.onnxruntime import OrtOptions
    assert "MatMulIntegerToFloatFusion" in OrtOptions().disabled_optimizers
    torch.manual_seed(2)
    model, x = Mlp(bias=False).eval(), torch.randn(4, 32)
    ep = qlower.quantize(model, (x,), _calibration((4, 32)), PER_TOKEN)
    xi = x * torch.tensor([[0.01], [1.0], [100.0], [3.0]])
    assert torch.equal(qlower.compile(ep, (x,), backend="onnxruntime")(xi),
                       qlower.compile(ep, (x,), backend="reference")(xi))


def test_dynamic_batch_and_sequence_on_onnxruntime():
    torch.manual_seed(3)
    model, x = Mlp().eval(), torch.randn(2, 6, 32)
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=512)
    dyn = {"x": {0: batch, 1: seq}}
    ort = qlower.compile(model, (x,), quantize=PER_TOKEN, calibration=_calibration((2, 6, 32)),
                         backend="onnxruntime", dynamic_shapes=dyn)
    ref = qlower.compile(model, (x,), quantize=PER_TOKEN, calibration=_calibration((2, 6, 32)),
                         backend="reference", dynamic_shapes=dyn)
    assert len(ort.report().compiled) == 1 and not ort.report().fallbacks
    for shape in [(1, 1, 32), (3, 17, 32), (5, 2, 32)]:
        xi = torch.randn(*shape)
        assert torch.equal(ort(xi), ref(xi))


class MovingOutliers(torch.nn.Module):
    """A linear whose input has, in each token, a different channel 100x the others: a static
    per-tensor scale must cover the outlier and leaves ~1 level for everything else."""
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.fc(x)


def _moving_outliers(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 16, 64, generator=g)
    idx = torch.randint(0, 64, (16,), generator=g)
    x[0, torch.arange(16), idx] *= 100 * torch.rand(16, generator=g)
    return x


def test_per_token_beats_static_on_token_dependent_outliers():
    torch.manual_seed(4)
    model = MovingOutliers().eval()
    cal = [(_moving_outliers(s),) for s in range(8)]
    tests = [_moving_outliers(100 + s) for s in range(4)]
    want = torch.cat([model(x) for x in tests])
    sqnr = {}
    for name, cfg in {"static": QuantConfig(), "per-token": PER_TOKEN}.items():
        cm = qlower.compile(model, cal[0], quantize=cfg, calibration=cal, backend="reference")
        sqnr[name] = qlower.report.sqnr_db(want, torch.cat([cm(x) for x in tests]))
    assert sqnr["per-token"] > sqnr["static"] + 6.0, sqnr


@pytest.mark.slow
def test_hf_llama_per_token_is_one_onnxruntime_cluster():
    """A real architecture (random weights): every linear lowered per token, one cluster, no
    fallbacks; integer ops exact, float ops between them (softmax, RMSNorm, SiLU) are each
    engine's own, so outputs are close rather than equal."""
    from qlower import zoo
    entry = zoo.get("hf-llama")
    model = entry.model()
    cal = entry.calibration(2)
    cfg = QuantConfig(activations="per-token", quantize_add=False, requantize_outputs=False)
    ep = qlower.quantize(model, entry.inputs(1), cal, cfg)
    ort = qlower.compile(ep, entry.inputs(1), backend="onnxruntime")
    report = ort.report()
    assert len(report.compiled) == 1 and not report.fallbacks
    linears = sum(1 for n in model.modules() if isinstance(n, torch.nn.Linear))
    assert report.rewrites["linear -> linear (per-token)"] == linears
    ref = qlower.compile(ep, entry.inputs(1), backend="reference")
    x = entry.inputs(1, seed=50)
    y, r = ort(*x), ref(*x)
    y, r = (y[0], r[0]) if isinstance(y, (tuple, list)) else (y, r)
    assert qlower.report.sqnr_db(r, y) > 40.0


def test_zoo_bert_per_token_session_builds_and_matches():
    """Regression: attention output (int32 accumulator) -> dequantize -> transpose -> per-token
    o_proj. Emitted as DequantizeLinear, ONNX Runtime's transpose optimizer pushed the Transpose
    through it by inserting a QuantizeLinear with the int32 zero point and the session failed to
    build (the whole cluster fell back). int32 dequantize is now Cast and Mul."""
    import dataclasses
    from qlower import zoo
    entry = zoo.get("bert")
    model = entry.model()
    cfg = dataclasses.replace(QuantConfig.from_name("transformer"), activations="per-token")
    ep = qlower.quantize(model, entry.inputs(1), entry.calibration(2), cfg)
    ort = qlower.compile(ep, entry.inputs(1), backend="onnxruntime")
    assert not ort.report().fallbacks
    ref = qlower.compile(ep, entry.inputs(1), backend="reference")
    x = entry.inputs(1, seed=7)
    assert qlower.report.sqnr_db(ref(*x), ort(*x)) > 40.0


class _TokenQuantize(torch.nn.Module):
    def forward(self, x):
        s = Q.token_scale(x)
        return s, Q.quantize_per_token(x, s)


def test_onnxruntime_quantize_per_token_on_ties_and_neighbours():
    """Rows with max |x| = 127 have scale exactly 1, so x / s = x: exact ties k + 0.5 of both
    signs, their fp32 neighbours, the bounds, zero rows and tiny rows, against the reference."""
    ties = torch.arange(-127, 127, dtype=torch.float32) + 0.5
    up, down = torch.nextafter(ties, torch.tensor(1e9)), torch.nextafter(ties, torch.tensor(-1e9))
    rows = [torch.cat([ties, torch.tensor([127.0])]), torch.cat([up, torch.tensor([-127.0])]),
            torch.cat([down, torch.tensor([127.0])]), torch.zeros(255), torch.full((255,), 1e-30),
            torch.randn(255) * 1e-3, torch.arange(255, dtype=torch.float32) * 2.0 ** -149,
            torch.full((255,), 60 * 2.0 ** -149)]
    x = torch.stack(rows)
    ort = qlower.compile(_TokenQuantize(), (x,), backend="onnxruntime")
    ref = qlower.compile(_TokenQuantize(), (x,), backend="reference")
    assert not ort.report().fallbacks
    for got, want in zip(ort(x), ref(x)):
        assert torch.equal(got, want)
