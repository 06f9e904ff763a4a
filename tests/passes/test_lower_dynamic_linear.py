"""LowerDynamicLinear: a linear whose input is quantized per tensor at run time becomes one
qlower.linear_dynamic (positive, idempotent, the function kept up to the float GEMM's rounding);
per-token and statically quantized linears are left (near misses)."""
import torch

import qlower
from qlower.passes import LowerDynamicLinear, PassContext
from qlower.quantize import QuantConfig
from qdq_models import Qkv, wide_calibration as _calibration, count_nodes as _count

DYNAMIC = QuantConfig(activations="dynamic")
Q = torch.ops.qlower


def _quantized(shape=(2, 7, 32), config=DYNAMIC, bias=True, seed=0):
    torch.manual_seed(seed)
    model, x = Qkv(bias).eval(), torch.randn(*shape)
    return qlower.quantize(model, (x,), _calibration(shape), config), x


def _lowering_input(ep):
    from qlower.passes import default_pipeline
    gm = ep.module()
    ctx = PassContext()
    for p in default_pipeline():
        if isinstance(p, LowerDynamicLinear):
            break
        p.run(gm, ctx)
    return gm


def test_lower_dynamic_linear_positive_idempotent_and_numerics_preserved():
    ep, x = _quantized()
    gm = _lowering_input(ep)
    want = gm(x)
    ctx = PassContext()
    assert LowerDynamicLinear().run(gm, ctx)
    gm.recompile()
    assert ctx.rewrites["linear -> linear_dynamic"] == 4
    assert _count(gm, Q.linear_dynamic.default) == 4 and _count(gm, Q.dequantize_dynamic.default) == 0
    got = gm(x)
    # the integer GEMM replaces a float GEMM of the dequantized values: equal up to its rounding
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not LowerDynamicLinear().run(gm, PassContext())


def test_lower_dynamic_linear_near_miss_leaves_per_token_and_static_linears():
    for config in (QuantConfig(activations="per-token"), QuantConfig()):
        ep, _ = _quantized(config=config)
        gm = _lowering_input(ep)
        assert not LowerDynamicLinear().run(gm, PassContext())
        assert _count(gm, Q.linear_dynamic.default) == 0
