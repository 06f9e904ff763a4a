"""LowerQDQ: DQ -> op (-> activation) -> Q becomes qlower integer ops (positive, with a fused
relu; numerics within 1 LSB of the Q/DQ graph), refusals that keep the float op (a weight
quantized along another axis, a possible int32 overflow), idempotence, the profile recorded."""
import torch

from qlower.passes import AttachQParams, LowerQDQ, PassContext, PassManager

from qdq_models import QDQLinear, graph_module

ops = torch.ops.qlower


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def lowered(model, x, profile="float"):
    gm = graph_module(model, x)
    ctx = PassManager([AttachQParams(), LowerQDQ()]).run(gm, PassContext(profile=profile))
    return gm, ctx


def test_lower_linear_positive_with_relu_fused():
    x = torch.randn(64, 16)
    m = QDQLinear(relu=True)
    gm, ctx = lowered(m, x)
    assert ops.linear.default in targets(gm) and torch.ops.aten.linear.default not in targets(gm)
    rq = next(n for n in gm.graph.nodes if n.target == ops.requantize.default)
    assert rq.args[4:6] == (100, 255)  # relu fused: lower bound is the zero point
    # Numerics before/after: integer path vs the float Q/DQ graph, within 1 LSB, mostly equal.
    ref = graph_module(m, x)
    diff = ((gm(x) - ref(x)).abs() / 0.1).round()
    assert diff.max() <= 1 and (diff == 0).float().mean() > 0.95


def test_lower_refuses_weight_axis_not_output_channel():
    gm, ctx = lowered(QDQLinear(axis=1), torch.randn(2, 16))
    assert torch.ops.aten.linear.default in targets(gm)
    assert any("axis 1" in r.reason for r in ctx.refusals)


def test_lower_refuses_possible_int32_overflow():
    gm, ctx = lowered(QDQLinear(k=70000, n=1, weight_value=-127), torch.randn(1, 70000))
    assert torch.ops.aten.linear.default in targets(gm)
    assert any("overflow" in r.reason for r in ctx.refusals)
    gm, ctx = lowered(QDQLinear(k=60000, n=1, weight_value=-127), torch.randn(1, 60000))
    assert ops.linear.default in targets(gm)  # 60000*255*127 < 2^31: provably safe


def test_lower_is_idempotent():
    gm, _ = lowered(QDQLinear(relu=True), torch.randn(2, 16))
    before = str(gm.graph)
    assert not LowerQDQ().run(gm, PassContext())
    assert str(gm.graph) == before


def test_fixed_profile_is_recorded_on_requantize():
    gm, _ = lowered(QDQLinear(), torch.randn(2, 16), profile="fixed")
    rq = next(n for n in gm.graph.nodes if n.target == ops.requantize.default)
    assert rq.args[8] == "fixed"
