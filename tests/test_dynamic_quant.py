"""Per-tensor dynamic activation quantization (QuantConfig(activations="dynamic"), the
`transformer-dynamic` preset): the numerics (numerics.dynamic_qparams, ONNX DynamicQuantizeLinear),
the Q/DQ program, and bit-exactness of onnxruntime against the reference backend on both CPU
formulations, fused into DynamicQuantizeMatMul or not (the LowerDynamicLinear pass's own tests:
tests/passes/test_lower_dynamic_linear.py)."""
import numpy as np
import pytest
import torch

import qlower
from qlower import numerics
from qlower.quantize import QuantConfig

from conftest import skip_numerics_unless_exact_here
from qdq_models import Qkv, wide_calibration as _calibration, count_nodes as _count

DYNAMIC = QuantConfig(activations="dynamic")
Q = torch.ops.qlower


# ------------------------------------------------------------------------------ numerics
def test_qparams_widen_the_range_to_zero_and_round_the_zero_point():
    s, zp = numerics.dynamic_qparams(torch.tensor([1.0, 2.0, 5.1]))          # positive only: lo = 0
    assert (s.item(), zp.item()) == (torch.tensor(5.1).div(255).item(), 0)
    s, zp = numerics.dynamic_qparams(torch.tensor([-3.0, -1.0]))             # negative only: hi = 0
    assert zp.item() == 255 and s.item() == torch.tensor(3.0).div(255).item()
    s, zp = numerics.dynamic_qparams(torch.zeros(4, 3))                        # hi == lo: scale 1
    assert (s.item(), zp.item()) == (1.0, 0)
    s, zp = numerics.dynamic_qparams(torch.empty(0, 8))
    assert (s.item(), zp.item()) == (1.0, 0)
    # lo = -1.5 * s exactly: zero point 1.5 rounds half to even -> 2; -2.5 * s -> 2
    for lo, want in ((-1.5, 2), (-2.5, 2), (-3.5, 4)):
        x = torch.tensor([lo, 255.0 + lo])
        s, zp = numerics.dynamic_qparams(x)
        assert s.item() == 1.0 and zp.item() == want
    assert s.dtype == torch.float32 and zp.dtype == torch.uint8 and s.dim() == zp.dim() == 0


def test_quantize_saturates_and_the_accumulator_is_scaled_by_the_product_first():
    q, s, zp = numerics.quantize_dynamic(torch.tensor([-1.0, 0.0, 0.5, 3.0]))
    assert q.dtype == torch.uint8 and q.tolist() == [0, 64, 96, 255]
    g = torch.Generator().manual_seed(0)
    acc = torch.randint(-2 ** 20, 2 ** 20, (64, 32), generator=g, dtype=torch.int32)
    sa, sw, b = torch.rand((), generator=g) / 255, torch.rand(32, generator=g) / 127, torch.randn(32, generator=g)
    y = numerics.dequantize_dynamic_accumulator(acc, sa, sw, b)
    assert torch.equal(y, acc.float() * (sa * sw) + b)
    # the order is the contract: scaling by the weight scale first differs in the last bit
    assert (y != (acc.float() * sw) * sa + b).sum() > 100


def _ort_dynamic_quantize_linear(x: np.ndarray):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "zp"])], "dql",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info(n, t, shape) for n, t, shape in
                               (("q", TensorProto.UINT8, ["n"]), ("s", TensorProto.FLOAT, []),
                                ("zp", TensorProto.UINT8, []))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def test_numerics_are_onnx_runtimes_dynamic_quantize_linear():
    """Independent of qlower's lowering: ONNX Runtime's own kernel on ties, one-signed tensors,
    zeros and magnitudes from 1e-30 to 1e30 gives the same codes, scale and zero point."""
    g = torch.Generator().manual_seed(3)
    cases = [torch.zeros(5), torch.tensor([-1.5, 253.5]), torch.tensor([0.5, 1.5, 2.5, 254.5, -0.5])]
    for i in range(60):
        x = torch.randn(int(torch.randint(1, 300, (1,), generator=g)), generator=g) * 10.0 ** (i % 13 - 6)
        cases.append(x.abs() if i % 4 == 1 else -x.abs() if i % 4 == 2 else x)
        cases.append(torch.round(x * 2) / 2)    # half-integers: ties once the scale is 1
    for x in cases:
        q, s, zp = numerics.quantize_dynamic(x)
        oq, os_, ozp = _ort_dynamic_quantize_linear(x.numpy())
        assert np.array_equal(q.numpy(), oq) and s.item() == os_.item() and zp.item() == ozp.item(), x


# ------------------------------------------------------------------------------ models
def _quantized(shape=(2, 7, 32), config=DYNAMIC, bias=True, seed=0):
    torch.manual_seed(seed)
    model, x = Qkv(bias).eval(), torch.randn(*shape)
    return qlower.quantize(model, (x,), _calibration(shape), config), x


def test_program_quantizes_each_linear_input_once_per_activation():
    ep, _ = _quantized()
    gm = ep.graph_module
    assert _count(gm, Q.quantize_dynamic.default) == 2         # x (shared by q/k/v) and relu's output
    assert _count(gm, Q.dequantize_dynamic.default) == 2
    assert _count(gm, Q.quantize_per_token.default) == 0


# ------------------------------------------------------------------------------ onnxruntime
def _onnx_ops(cm) -> list[str]:
    import onnx
    return [n.op_type for c in cm.report().compiled for n in onnx.load_from_string(c.onnx).graph.node]


@pytest.mark.parametrize("bits", [8, 7])
def test_onnxruntime_bit_exact_against_reference(vnni, bits):
    """Two dynamic quantizations (one shared by three linears), four linears with biases, float
    mul/add/relu between (IEEE-exact in both engines): every element equal, on both CPU
    formulations, at magnitudes from 1e-3 to 1e3."""
    ep, x = _quantized(config=QuantConfig(activations="dynamic", weight_bits=bits))
    ref = qlower.compile(ep, (x,), backend="reference")
    ort = qlower.compile(ep, (x,), backend="onnxruntime")
    assert not ort.report().fallbacks
    assert ort.report().rewrites["linear -> linear_dynamic"] == 4
    skip_numerics_unless_exact_here(vnni, full_range_weights=bits == 8)
    for i in range(8):
        xi = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(i)) * (10.0 ** (i % 7 - 3))
        assert torch.equal(ort(xi), ref(xi))


@pytest.mark.parametrize("shape", [(1, 1, 32), (3, 32), (32,)])
def test_onnxruntime_bit_exact_for_single_rows_and_vectors(shape):
    ep, x = _quantized(shape=shape, seed=4)
    ref = qlower.compile(ep, (x,), backend="reference")
    ort = qlower.compile(ep, (x,), backend="onnxruntime")
    assert not ort.report().fallbacks
    for i in range(10):
        xi = torch.randn(*shape, generator=torch.Generator().manual_seed(i)) * (10.0 ** (i % 5 - 2))
        assert torch.equal(ort(xi), ref(xi))
    zeros = torch.zeros(*shape)        # scale 1, zero point 0: the biases pass through
    assert torch.equal(ort(zeros), ref(zeros))


def test_onnxruntime_form_is_ort_dynamic_models_and_fuses_into_dynamic_quantize_matmul(tmp_path):
    """One DynamicQuantizeLinear per activation and one MatMulIntegerToFloat per linear with its
    bias inside (no Cast, no Mul, no Add); with the backend's session options ONNX Runtime fuses
    each unshared pair into DynamicQuantizeMatMul, the kernel of its own `quantize_dynamic`."""
    import onnx
    import onnxruntime as ort
    from qlower.backends.onnxruntime import OrtOptions
    ep, x = _quantized()
    cm = qlower.compile(ep, (x,), backend="onnxruntime")
    ops = _onnx_ops(cm)
    assert ops.count("DynamicQuantizeLinear") == 2 and ops.count("MatMulIntegerToFloat") == 4, ops
    assert not {"Cast", "MatMulInteger", "QuantizeLinear"} & set(ops), ops
    assert ops.count("Mul") == ops.count("Add") == 1, ops      # the model's own q * k + v
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(cm.report().compiled[0].onnx, so, providers=["CPUExecutionProvider"],
                         disabled_optimizers=list(OrtOptions().disabled_optimizers))
    optimized = [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]
    assert optimized.count("DynamicQuantizeMatMul") == 1, optimized   # o: its input is relu's alone
    assert optimized.count("MatMulIntegerToFloat") == 3, optimized     # q/k/v share one quantization


def test_standard_onnx_form_is_bit_exact_too():
    """Without contrib ops (what a standard-ONNX engine reads): MatMulInteger, Cast, the scale
    product and the bias add, in the numerics' order."""
    from qlower.onnx.lowering.onnx_ops import standard_onnx_only
    ep, x = _quantized(seed=2)
    ref = qlower.compile(ep, (x,), backend="reference")
    with standard_onnx_only():
        ort = qlower.compile(ep, (x,), backend="onnxruntime")
    ops = _onnx_ops(ort)
    assert "MatMulIntegerToFloat" not in ops and ops.count("MatMulInteger") == 4, ops
    for i in range(6):
        xi = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(i)) * (10.0 ** (i - 3))
        assert torch.equal(ort(xi), ref(xi))


def test_preset_is_dynamic_and_engines_without_a_lowering_quantize_statically():
    from qlower.backends.iree.backend import IreeBackend
    config = QuantConfig.from_name("transformer-dynamic")
    assert config.activations == "dynamic" and config.run_time_activations
    adjusted, note = IreeBackend.quant_config(config, preset=True)
    assert adjusted.activations == "static" and "dynamic quantization" in note
    assert IreeBackend.quant_config(config, preset=False)[0].activations == "dynamic"   # explicit: respected
    with pytest.raises(qlower.QuantizeError, match="'static', 'per-token' or 'dynamic'"):
        QuantConfig(activations="per-tensor")


def _linear_weight_ranges(ep) -> set[tuple[int, int]]:
    return {(n.args[4], n.args[5]) for n in ep.graph_module.graph.nodes
            if n.target == torch.ops.quantized_decomposed.dequantize_per_channel.default and n.args[6] is torch.int8}


def test_preset_without_vnni_runs_7_bit_weights_on_the_u8_s8_kernel(monkeypatch):
    """`transformer-dynamic` on a CPU without VNNI: 7-bit weights in its linears too (ORT's own
    advice for quantize_dynamic there; DynamicQuantizeMatMul's u8 x s8 path is 1.08-1.16x
    faster than the u8 x u8 one 8-bit weights need), said in the report, bit-exact with the
    reference on every CPU. With VNNI: 8 bits. Near miss: the per-token `transformer` preset
    keeps 8 bits in its linears (tests/test_per_token.py)."""
    import onnx
    from qlower.core import cpu
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(cpu, "has_vnni", lambda: False)
    ep = qlower.quantize(Qkv().eval(), (x,), _calibration((2, 7, 32)), "transformer-dynamic", backend="onnxruntime")
    assert _linear_weight_ranges(ep) == {(-63, 63)}
    ort, ref = (qlower.compile(ep, (x,), backend=b) for b in ("onnxruntime", "reference"))
    graph = onnx.load_from_string(ort.report().compiled[0].onnx).graph
    weights = {i.name: i.data_type for i in graph.initializer}
    kernels = [n for n in graph.node if n.op_type == "MatMulIntegerToFloat"]
    assert len(kernels) == 4 and not ort.report().fallbacks
    assert {weights[n.input[1]] for n in kernels} == {onnx.TensorProto.INT8}   # u8 x s8, not u8 x u8
    for i in range(6):
        xi = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(i)) * (10.0 ** (i - 3))
        assert torch.equal(ort(xi), ref(xi))
    cm = qlower.compile(Qkv().eval(), (x,), quantize="transformer-dynamic", calibration=_calibration((2, 7, 32)),
                        backend="onnxruntime")
    assert any(n.startswith("7-bit weights: this CPU lacks VNNI") for n in cm.report().notes), cm.report().notes
    monkeypatch.setattr(cpu, "has_vnni", lambda: True)
    ep = qlower.quantize(Qkv().eval(), (x,), _calibration((2, 7, 32)), "transformer-dynamic", backend="onnxruntime")
    assert _linear_weight_ranges(ep) == {(-127, 127)}


def test_saved_dynamic_program_loads_and_runs_bit_identically(tmp_path):
    """The tuple-valued quantize_dynamic survives the safe artifact format (program JSON + weights)."""
    ep, x = _quantized(seed=3)
    cm = qlower.compile(ep, (x,), backend="onnxruntime")
    loaded = qlower.load(cm.save(tmp_path / "m.pt2"))
    assert loaded.report().rewrites["linear -> linear_dynamic"] == 4 and not loaded.report().fallbacks
    for i in range(3):
        xi = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(i))
        assert torch.equal(loaded(xi), cm(xi))
