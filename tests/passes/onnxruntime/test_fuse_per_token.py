"""FusePerTokenLinear (onnxruntime legalization): a per-token linear's integer GEMM and the
dequantization of its accumulator become one qlower_ort.linear_per_token node (positive, values
bit-identical, idempotent); an accumulator with a second user is left (near miss)."""
import torch

import qlower
from qlower.passes import PassContext
from qlower.quantize import QuantConfig
from qdq_models import Mlp, wide_calibration as _calibration

PER_TOKEN = QuantConfig(activations="per-token")
Q = torch.ops.qlower


def _per_token_lowered(bias=False):
    torch.manual_seed(6)
    model, x = Mlp(bias=bias).eval(), torch.randn(2, 5, 32)
    ep = qlower.quantize(model, (x,), _calibration((2, 5, 32)), PER_TOKEN)
    return qlower.compile(ep, (x,), backend="reference").graph_module, x


def test_fuse_per_token_pass_keeps_values_and_is_idempotent():
    from qlower.passes.onnxruntime.fuse_per_token import FusePerTokenLinear
    gm, x = _per_token_lowered(bias=True)
    want = gm(x)
    assert FusePerTokenLinear().run(gm, PassContext())
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count("qlower_ort.linear_per_token.default") == 2
    assert "qlower.dequantize_per_token_acc.default" not in targets and "qlower.linear.default" not in targets
    assert torch.equal(gm(x), want)   # the fused op's kernel is the canonical composition
    assert not FusePerTokenLinear().run(gm, PassContext())


def test_fuse_per_token_pass_near_miss_accumulator_with_a_second_user():
    from qlower.passes.onnxruntime.fuse_per_token import FusePerTokenLinear
    gm, x = _per_token_lowered()
    acc = next(n for n in gm.graph.nodes if n.target is Q.linear.default)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(out):
        extra = gm.graph.call_function(torch.ops.aten.sum.default, (acc,))
    out.args = ((*out.args[0], extra) if isinstance(out.args[0], (tuple, list)) else (out.args[0], extra),)
    gm.recompile()
    FusePerTokenLinear().run(gm, PassContext())
    assert acc in gm.graph.nodes   # still there, still a qlower.linear with both users
    assert len(acc.users) == 2
