"""FuseDequantize (passes/onnxruntime/fuse_dequantize.py): a linear with a float output as ONE
ONNX Runtime kernel (QGemm with a bias, MatMulIntegerToFloat without), on BOTH kinds of CPU
whatever this machine is (VNNI forced on and off: s8 or u8 weights), compared element by
element with the reference backend."""
import onnx
import pytest
import torch

import qlower
from qlower.core import cpu
from qlower.passes.onnxruntime.fuse_dequantize import FuseDequantize
from qlower.passes import PassContext, PassManager

from conftest import calib, skip_numerics_unless_exact_here

STATIC = "transformer-static"   # float outputs after every linear (requantize_outputs=False)


class Head(torch.nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.a = torch.nn.Linear(24, 40, bias=bias)
        self.b = torch.nn.Linear(40, 8, bias=bias)

    def forward(self, x):
        return self.b(torch.nn.functional.layer_norm(self.a(x), (40,)))


def _program(shape, bias=True, bits=8):
    torch.manual_seed(0)
    x = (torch.randn(*shape),)
    config = qlower.QuantConfig.from_name(STATIC)
    if bits != 8:
        import dataclasses
        config = dataclasses.replace(config, weight_bits=bits)
    return qlower.quantize(Head(bias).eval(), x, calib(shape), config), x


def _onnx_ops(cm) -> list[str]:
    return [n.op_type for c in cm.report().compiled for n in onnx.load_from_string(c.onnx).graph.node]


@pytest.mark.parametrize("shape", [(24,), (5, 24), (2, 7, 24), (1, 1, 24)], ids=["1d", "2d", "3d", "one-row"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_fused_kernel_is_bit_exact_on_both_formulations(vnni, shape, bias):
    ep, x = _program(shape, bias)
    cm, ref = qlower.compile(ep, x, backend="onnxruntime"), qlower.compile(ep, x, backend="reference")
    assert not cm.report().fallbacks
    ops = _onnx_ops(cm)
    fused = "QGemm" if bias else "MatMulIntegerToFloat"
    assert ops.count(fused) == 2 and "MatMulInteger" not in ops and "Cast" not in ops, ops
    skip_numerics_unless_exact_here(vnni)
    for seed in range(6):
        xi = (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 10.0 ** (seed - 3),)
        assert torch.equal(cm(*xi), ref(*xi))


def test_u8_weights_without_vnni_are_still_fused_and_exact(monkeypatch):
    """8-bit weights on a CPU without VNNI: the u8 formulation (w + 128) inside the fused kernel."""
    monkeypatch.setattr(cpu, "has_vnni", lambda: False)
    ep, x = _program((3, 24), bits=8)
    cm, ref = qlower.compile(ep, x, backend="onnxruntime"), qlower.compile(ep, x, backend="reference")
    assert _onnx_ops(cm).count("QGemm") == 2
    for seed in range(4):
        xi = (torch.randn(3, 24, generator=torch.Generator().manual_seed(seed)) * 4,)
        assert torch.equal(cm(*xi), ref(*xi))


def test_dynamic_rows_run_at_many_sizes_without_recompiling():
    ep, x = _program((2, 7, 24))
    ds = ({0: torch.export.Dim("b", max=16), 1: torch.export.Dim("s", max=64)},)
    ep = qlower.quantize(Head().eval(), x, calib((2, 7, 24)), STATIC, dynamic_shapes=ds)
    cm = qlower.compile(ep, x, backend="onnxruntime", dynamic_shapes=ds)
    ref = qlower.compile(ep, x, backend="reference", dynamic_shapes=ds)
    assert not cm.report().fallbacks and "QGemm" in _onnx_ops(cm)
    for b, s in [(1, 1), (3, 5), (16, 64), (2, 7)]:
        xi = (torch.randn(b, s, 24, generator=torch.Generator().manual_seed(b * s)),)
        assert torch.equal(cm(*xi), ref(*xi))


def _lowered(ep, x):
    return qlower.compile(ep, x, backend="reference").graph_module


def test_pass_fuses_keeps_values_and_is_idempotent():
    ep, x = _program((2, 7, 24))
    gm = _lowered(ep, x)
    want = gm(*x)
    assert PassManager([FuseDequantize()]).run(gm, PassContext()).rewrites["linear + dequantize -> linear_dequant"] == 2
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count("qlower_ort.linear_dequant.default") == 2
    assert "qlower.linear.default" not in targets and "qlower.dequantize.default" not in targets
    assert torch.equal(gm(*x), want)   # the fused op's kernel is the canonical composition
    assert not FuseDequantize().run(gm, PassContext())


def test_near_miss_accumulator_with_a_second_user():
    ep, x = _program((2, 7, 24))
    gm = _lowered(ep, x)
    accs = [n for n in gm.graph.nodes if n.target is torch.ops.qlower.linear.default]
    out = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(out):
        extra = gm.graph.call_function(torch.ops.aten.sum.default, (accs[0],))
    out.args = ((*out.args[0], extra) if isinstance(out.args[0], (tuple, list)) else (out.args[0], extra),)
    gm.recompile()
    ctx = PassContext()
    FuseDequantize().run(gm, ctx)
    assert ctx.rewrites["linear + dequantize -> linear_dequant"] == 1   # only the other linear
    assert accs[0] in gm.graph.nodes and len(accs[0].users) == 2


def test_near_miss_requantized_output_is_left_to_fuse_requantize():
    """The plain int8 preset requantizes linear outputs: no dequantize of an accumulator."""
    torch.manual_seed(0)
    x = (torch.randn(3, 24),)
    ep = qlower.quantize(torch.nn.Sequential(torch.nn.Linear(24, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)).eval(),
                         x, calib((3, 24)), qlower.QuantConfig())
    gm = _lowered(ep, x)
    first = next(n for n in gm.graph.nodes if n.target is torch.ops.qlower.linear.default)
    assert next(iter(first.users)).target is not torch.ops.qlower.dequantize.default
    ctx = PassContext()
    FuseDequantize().run(gm, ctx)
    assert first in gm.graph.nodes
