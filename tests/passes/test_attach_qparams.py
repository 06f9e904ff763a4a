"""AttachQParams: typed QParams on every Q/DQ node whose scale and zero point are constants (per
tensor and per channel); none, and a recorded refusal, where they are computed; idempotent; the
graph's values unchanged (metadata only)."""
import torch

from qlower.meta import QPARAMS_KEY, QParams
from qlower.passes import AttachQParams, PassContext

from qdq_models import QDQLinear, graph_module

qd = torch.ops.quantized_decomposed


def test_attach_qparams_per_tensor_and_per_channel():
    m = QDQLinear()
    gm = graph_module(m, torch.randn(2, 16))
    ctx = PassContext()
    assert AttachQParams().run(gm, ctx)
    qps = [n.meta[QPARAMS_KEY] for n in gm.graph.nodes if QPARAMS_KEY in n.meta]
    per_channel = [q for q in qps if q.per_channel]
    assert len(per_channel) == 1
    assert per_channel[0].axis == 0 and per_channel[0].dtype == torch.int8
    assert per_channel[0].scale == tuple(m.ws.tolist())
    assert QParams((0.05,), (0,), 0, 255, torch.uint8) in qps
    assert not AttachQParams().run(gm, ctx)  # idempotent


class RunTimeScale(torch.nn.Module):
    """Q/DQ with a scale computed from the input (the `.tensor` overloads): no constant qparams."""

    def forward(self, x):
        scale = x.abs().amax() / 127 + 1e-6
        zero_point = torch.zeros((), dtype=torch.int64)
        q = qd.quantize_per_tensor.tensor(x, scale, zero_point, -127, 127, torch.int8)
        return qd.dequantize_per_tensor.tensor(q, scale, zero_point, -127, 127, torch.int8)


def test_attach_qparams_near_miss_run_time_scale_gets_none_and_a_refusal():
    gm = graph_module(RunTimeScale(), torch.randn(2, 16))
    before = str(gm.graph)
    ctx = PassContext()
    assert not AttachQParams().run(gm, ctx)
    assert not any(QPARAMS_KEY in n.meta for n in gm.graph.nodes)
    assert len(ctx.refusals) == 2 and all("not constants" in r.reason for r in ctx.refusals)
    assert str(gm.graph) == before


def test_attach_qparams_keeps_the_values_bit_for_bit():
    x = torch.randn(2, 16)
    gm = graph_module(QDQLinear(relu=True), torch.randn(2, 16))
    want = gm(x)
    assert AttachQParams().run(gm, PassContext())
    gm.recompile()
    assert torch.equal(gm(x), want)
