"""Exhaustive kernel proofs (onnx/kernel_proofs.py) and the formulations the
emitter picks from them: a fused ONNX Runtime kernel is used only where it equals the canonical
numerics on the whole input domain."""
import numpy as np
import onnx
import pytest
import torch

import qlower
from qlower.onnx.lowering import integer as emit_module
from qlower.onnx import kernel_proofs as kp

from conftest import calib


def add_qparams(seed):
    rng = np.random.default_rng(seed)
    sa, sb = (float(v) for v in rng.uniform(0.005, 0.05, 2).astype(np.float32))
    sy = float(np.float32(rng.uniform(0.01, 0.08)))
    za, zb, zy = (int(v) for v in rng.integers(0, 256, 3))
    return sa, za, sb, zb, sy, zy


def first(pred, seeds=range(60)):
    return next(add_qparams(s) for s in seeds if pred(add_qparams(s)))


def engine_equals_canonical(qp):
    return np.array_equal(kp._run_qlinear_add(*qp), kp._canonical_add(*qp))


def test_add_proof_refuses_where_the_kernel_rounds_differently():
    """MLAS rounds a·(sa/sy) + (b·(sb/sy) + c) with FMAs; for some qparams that differs from
    Q(DQ(a) + DQ(b)) on a few of the 65,536 pairs: never proven there."""
    qp = first(lambda q: not engine_equals_canonical(q))
    assert not kp.qlinear_add_exact(*qp)


def test_add_proof_accepts_and_the_kernel_is_exact_on_both_code_paths():
    qp = first(lambda q: kp.qlinear_add_exact(*q))
    sa, za, sb, zb, sy, zy = qp
    # main path: every pair
    assert engine_equals_canonical(qp)
    # single-element spans (MLAS's scalar path): the emulation's claim checked on the engine
    rng = np.random.default_rng(1)
    pairs = rng.integers(0, 256, (64, 2)).astype(np.uint8)
    for a, b in pairs:
        got = _one_element_qlinear_add(qp, a, b)
        want = torch.ops.qlower.add(torch.tensor([a]), sa, za, torch.tensor([b]), sb, zb, sy, zy, 0, 255,
                                    torch.uint8)
        assert got == int(want[0])


def _one_element_qlinear_add(qp, a, b):
    sa, za, sb, zb, sy, zy = qp
    from onnx import TensorProto, helper
    import onnxruntime as ort
    consts = [helper.make_tensor(n, TensorProto.FLOAT, [], [v]) for n, v in (("sa", sa), ("sb", sb), ("sy", sy))]
    consts += [helper.make_tensor(n, TensorProto.UINT8, [], [v]) for n, v in (("za", za), ("zb", zb), ("zy", zy))]
    g = helper.make_graph([helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"],
                                            domain="com.microsoft")], "g",
                          [helper.make_tensor_value_info(n, TensorProto.UINT8, [1]) for n in "ab"],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [1])], consts)
    m = helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 17),
                                                           helper.make_opsetid("com.microsoft", 1)])
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return int(s.run(None, {"a": np.array([a], np.uint8), "b": np.array([b], np.uint8)})[0][0])


def test_add_emulation_describes_the_engine():
    for seed in range(5):
        qp = add_qparams(seed)
        emulated = kp._mlas_avx2_add(*qp)
        assert emulated is not None and np.array_equal(emulated[0], kp._run_qlinear_add(*qp))


@pytest.mark.parametrize("size", [1, 4, 16, 49])
def test_global_average_pool_proof(size):
    assert kp.qlinear_global_average_pool_exact(size, 1.0, 17)


def test_global_average_pool_proof_declines_large_sizes():
    assert not kp.qlinear_global_average_pool_exact(kp.POOL_PROOF_MAX_SIZE + 1, 1.0, 0)


class Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.a(x))
        z = torch.relu(self.b(y) + y)
        return self.head(torch.nn.functional.adaptive_avg_pool2d(z, 1).flatten(1))


def _ops(cm):
    [info] = [c for c in cm.report().clusters if c.onnx]
    return [n.op_type for n in onnx.load_from_string(info.onnx).graph.node]


def _compile_residual(monkeypatch, add_proven, pool_proven):
    monkeypatch.setenv("QLOWER_CACHE_DIR", "off")
    monkeypatch.setattr(emit_module, "qlinear_add_exact", lambda *a: add_proven)
    monkeypatch.setattr(emit_module, "qlinear_global_average_pool_exact", lambda *a: pool_proven)
    torch.manual_seed(0)
    model, x = Residual().eval(), (torch.randn(1, 8, 6, 6),)
    ep = qlower.quantize(model, x, calib((1, 8, 6, 6)), config=qlower.QuantConfig(weight_bits=7))
    return ep, x, qlower.compile(ep, x, backend="onnxruntime")


@pytest.mark.parametrize("proven", [True, False])
def test_emitter_uses_fused_kernels_only_where_proven(monkeypatch, proven):
    ep, x, cm = _compile_residual(monkeypatch, proven, proven)
    ops = _ops(cm)
    assert ("QLinearAdd" in ops) == proven and ("QLinearGlobalAveragePool" in ops) == proven
    assert ("ReduceSum" in ops) == (not proven) and (ops.count("DequantizeLinear") >= 2) == (not proven)


def test_fused_kernels_bit_exact_against_reference_where_proven(monkeypatch):
    """With the real proofs: whatever the emitter picked equals the reference on every element."""
    monkeypatch.setenv("QLOWER_CACHE_DIR", "off")
    torch.manual_seed(0)
    model, x = Residual().eval(), (torch.randn(1, 8, 6, 6),)
    ep = qlower.quantize(model, x, calib((1, 8, 6, 6)), config=qlower.QuantConfig(weight_bits=7))
    ref, ort = qlower.compile(ep, x, backend="reference"), qlower.compile(ep, x, backend="onnxruntime")
    assert "QLinearGlobalAveragePool" in _ops(ort)  # 36 elements: always provable
    for batch in calib((1, 8, 6, 6), n=16, seed=5):
        assert torch.equal(ort(*batch), ref(*batch))


def test_broadcast_add_is_not_fused():
    class Broadcast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 8)
            self.b = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.a(x) + self.b(x[:, :1])   # [B, 4, 8] + [B, 1, 8]
    torch.manual_seed(0)
    x = (torch.randn(2, 4, 8),)
    cm = qlower.compile(Broadcast().eval(), x, quantize=qlower.QuantConfig(weight_bits=7),
                        calibration=calib((2, 4, 8)), backend="onnxruntime")
    assert "QLinearAdd" not in _ops(cm)


class Residuals(torch.nn.Module):
    def __init__(self, blocks=4):
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(8, 8, 3, padding=1) for _ in range(blocks))

    def forward(self, x):
        for conv in self.convs:
            x = torch.relu(conv(x) + x)
        return x


def _add_scales(ep):
    adds = [n for n in ep.graph.nodes if n.target == torch.ops.aten.add.Tensor]
    return [next(iter(a.users)).args[1] if next(iter(a.users)).target != torch.ops.aten.relu.default
            else next(iter(next(iter(a.users)).users)).args[1] for a in adds]


def test_add_scales_snap_to_proven_exact_kernels(monkeypatch):
    """Quantizing for onnxruntime moves an add's output scale by a few ulps where that makes
    QLinearAdd provably exact; every add then is one QLinearAdd, bit-exact with the reference."""
    from qlower.backends.onnxruntime import OnnxRuntimeBackend
    from qlower.backends.onnxruntime.snap_scales import MAX_ULPS
    from qlower.quantize import quantize as quantize_internal
    monkeypatch.setenv("QLOWER_CACHE_DIR", "off")
    cfg = qlower.QuantConfig(weight_bits=7)
    for seed in range(10):
        torch.manual_seed(seed)
        model, x = Residuals().eval(), (torch.randn(1, 8, 6, 6),)
        data = calib((1, 8, 6, 6), seed=seed)
        plain = quantize_internal(model, x, data, cfg)
        snapped = quantize_internal(model, x, data, cfg, adjust_observers=OnnxRuntimeBackend.adjust_observers)
        before, after = _add_scales(plain), _add_scales(snapped)
        if before != after:
            break
    else:
        pytest.fail("no add needed snapping in 10 seeds (expected ~1 in 4 adds to)")
    ulps = [abs(int(np.float32(a).view(np.int32)) - int(np.float32(b).view(np.int32))) for a, b in zip(before, after)]
    assert 0 < max(ulps) <= MAX_ULPS
    ref, ort = qlower.compile(snapped, x, backend="reference"), qlower.compile(snapped, x, backend="onnxruntime")
    ops = _ops(ort)
    assert ops.count("QLinearAdd") == 4 and "Add" not in ops
    for batch in calib((1, 8, 6, 6), n=8, seed=3):
        assert torch.equal(ort(*batch), ref(*batch))


def test_compile_for_onnxruntime_snaps_and_stays_accurate(monkeypatch):
    monkeypatch.setenv("QLOWER_CACHE_DIR", "off")
    torch.manual_seed(1)
    model, x = Residuals().eval(), (torch.randn(1, 8, 6, 6),)
    cm = qlower.compile(model, x, quantize="int8", calibration=calib((1, 8, 6, 6)), backend="onnxruntime")
    assert _ops(cm).count("QLinearAdd") == 4
    with torch.no_grad():
        want = model(*x)
    err = (cm(*x) - want).abs().max().item()
    assert err < 0.05 * want.abs().max().item()


def test_public_quantize_for_a_backend_snaps_like_compile(monkeypatch):
    """`qlower.quantize(..., backend="onnxruntime")` gives the program `compile` would quantize:
    7-bit weights on this CPU's preset choice and snapped add scales, so every add is QLinearAdd."""
    from qlower.backends.onnxruntime import OnnxRuntimeBackend
    from qlower.core.cpu import has_vnni
    from qlower.quantize import quantize as quantize_internal
    monkeypatch.setenv("QLOWER_CACHE_DIR", "off")
    torch.manual_seed(1)
    model, x = Residuals().eval(), (torch.randn(1, 8, 6, 6),)
    data = calib((1, 8, 6, 6))
    ep = qlower.quantize(model, x, data, "int8", backend="onnxruntime")
    cfg = qlower.QuantConfig(weight_bits=8 if has_vnni() else 7)
    want = quantize_internal(model, x, data, cfg, adjust_observers=OnnxRuntimeBackend.adjust_observers)
    assert _add_scales(ep) == _add_scales(want)
    assert _ops(qlower.compile(ep, x, backend="onnxruntime")).count("QLinearAdd") == 4
    neutral = qlower.quantize(model, x, data, "int8")  # backend-neutral: full 8-bit weights, no snapping
    assert _add_scales(neutral) == _add_scales(quantize_internal(model, x, data, qlower.QuantConfig()))
