"""FuseRequantize (passes/onnxruntime/fuse_requantize.py) and the integer formulations it
chooses between, on BOTH kinds of CPU whatever this machine is: VNNI is forced on and off, so
the fused s8 kernels (QLinearConv/QGemm) and the u8-weight ConvInteger/MatMulInteger path are
each compared element by element with the reference backend."""
import onnx
import pytest
import torch

import qlower
from qlower.core import cpu
from qlower.passes.onnxruntime.fuse_requantize import FuseRequantize
from qlower.passes import PassContext, PassManager

from conftest import calib, skip_numerics_unless_exact_here


class ConvMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _program(bits: int):
    torch.manual_seed(0)
    x = (torch.randn(1, 3, 6, 6),)
    return qlower.quantize(ConvMlp().eval(), x, calib((1, 3, 6, 6)), qlower.QuantConfig(weight_bits=bits)), x


def _onnx_ops(cm) -> list[str]:
    return [n.op_type for c in cm.report().compiled for n in onnx.load_from_string(c.onnx).graph.node]


@pytest.mark.parametrize("bits", [7, 8])
def test_formulation_per_cpu_is_bit_exact(vnni, bits):
    ep, x = _program(bits)
    cm, ref = qlower.compile(ep, x, backend="onnxruntime"), qlower.compile(ep, x, backend="reference")
    assert not cm.report().fallbacks
    ops = _onnx_ops(cm)
    fused = vnni or bits == 7   # u8 x s8 is exact with VNNI or 7-bit weights only
    assert ("QLinearConv" in ops) == fused and ("ConvInteger" in ops) == (not fused), ops
    skip_numerics_unless_exact_here(vnni, full_range_weights=bits == 8)
    for seed in range(4):
        xi = (torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(seed)) * 2,)
        assert torch.equal(cm(*xi), ref(*xi))


def _lowered_graph(ep, profile="float"):
    ref = qlower.compile(ep, (torch.randn(1, 3, 6, 6),), backend="reference", profile=profile)
    gm = ref.graph_module
    return gm


def test_pass_fuses_and_is_idempotent(vnni):
    ep, x = _program(7)
    gm = _lowered_graph(ep)
    want = gm(*x)
    assert PassManager([FuseRequantize()]).run(gm, PassContext()).rewrites
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert {"qlower_ort.conv_requant.default", "qlower_ort.linear_requant.default"} <= targets
    assert "qlower.requantize.default" not in targets
    assert torch.equal(gm(*x), want)   # each fused op's kernel is the canonical composition
    assert not FuseRequantize().run(gm, PassContext())


def test_near_miss_full_range_weights_without_vnni_and_fixed_profile(monkeypatch):
    monkeypatch.setattr(cpu, "has_vnni", lambda: False)
    ep, _ = _program(8)
    assert not FuseRequantize().run(_lowered_graph(ep), PassContext())
    monkeypatch.setattr(cpu, "has_vnni", lambda: True)
    ep, _ = _program(7)
    assert not FuseRequantize().run(_lowered_graph(ep, profile="fixed"), PassContext())
