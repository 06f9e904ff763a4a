"""LowerPerTokenLinear: a linear whose activation is quantized per token becomes an integer GEMM
dequantized with the run-time row scale (positive, idempotent), a statically quantized linear is
left (near miss), and the function is kept up to the float GEMM's rounding."""
import pytest
import torch

import qlower
from qlower.passes import AttachQParams, LowerPerTokenLinear, PassContext, PassManager, default_pipeline
from qlower.quantize import QuantConfig
from qdq_models import Mlp, wide_calibration as _calibration, count_nodes as _count

PER_TOKEN = QuantConfig(activations="per-token")
Q = torch.ops.qlower


def _program(model, x, cal):
    return qlower.quantize(model, (x,), cal, PER_TOKEN).module()


def _before_lowering(gm):
    """The default pipeline up to (not including) LowerPerTokenLinear."""
    passes = default_pipeline()
    index = next(i for i, p in enumerate(passes) if isinstance(p, LowerPerTokenLinear))
    PassManager(passes[:index]).run(gm, PassContext())
    return gm


def test_pass_lowers_to_integer_linear_and_is_idempotent():
    torch.manual_seed(0)
    x = torch.randn(3, 32)
    gm = _before_lowering(_program(Mlp().eval(), x, _calibration((3, 32))))
    ctx = PassContext()
    assert LowerPerTokenLinear().run(gm, ctx)
    assert ctx.rewrites["linear -> linear (per-token)"] == 2
    assert _count(gm, Q.linear.default) == 2 and _count(gm, torch.ops.aten.linear.default) == 0
    assert _count(gm, Q.dequantize_per_token.default) == 0
    code = gm.code
    assert not LowerPerTokenLinear().run(gm, PassContext())
    assert gm.code == code


def test_pass_leaves_statically_quantized_linear_alone():
    torch.manual_seed(0)
    x = torch.randn(3, 32)
    gm = qlower.quantize(Mlp().eval(), (x,), _calibration((3, 32)), QuantConfig()).module()
    PassManager([AttachQParams()]).run(gm, PassContext())
    assert not LowerPerTokenLinear().run(gm, PassContext())
    assert _count(gm, torch.ops.aten.linear.default) == 2


@pytest.mark.parametrize("bias", [True, False])
def test_pass_keeps_the_function(bias):
    """Lowered (int32 GEMM, fp32(fp32(acc) * s_w) * s_t) vs the Q/DQ program (float GEMM of the
    dequantized values): the same products, rounded differently — a few fp32 ulps apart."""
    torch.manual_seed(0)
    x = torch.randn(5, 32)
    model = Mlp(bias).eval()
    want = _program(model, x, _calibration((5, 32)))(x)
    gm = _before_lowering(_program(model, x, _calibration((5, 32))))
    LowerPerTokenLinear().run(gm, PassContext())
    gm.recompile()
    got = gm(x)[0] if isinstance(gm(x), (tuple, list)) else gm(x)
    want = want[0] if isinstance(want, (tuple, list)) else want
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
