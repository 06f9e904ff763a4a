"""CanonicalizeQDQ: quantized_decomposed Q/DQ become qlower's canonical quantize / dequantize and a
value-preserving DQ -> Q pair is dropped (positive, values, idempotence); the canonical quantize
divides by the scale as qlower.numerics does; Q/DQ without QParams, and a DQ -> Q pair with other
parameters, are left (near misses)."""
import torch

from qlower.passes import AttachQParams, CanonicalizeQDQ, PassContext, PassManager

from qdq_models import RequantChain, graph_module

ops = torch.ops.qlower
qd = torch.ops.quantized_decomposed


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_canonicalize_replaces_qdq_and_drops_identity_pair():
    x = torch.randn(3, 5)
    gm = graph_module(RequantChain(), x)
    ref = graph_module(RequantChain(), x)
    PassManager([AttachQParams(), CanonicalizeQDQ()]).run(gm)
    t = targets(gm)
    assert t.count(ops.quantize.default) == 1 and t.count(ops.dequantize.default) == 1
    assert not any(getattr(n, "namespace", "") == "quantized_decomposed" for n in t)
    assert torch.equal(gm(x), ref(x))
    before = str(gm.graph)
    assert not CanonicalizeQDQ().run(gm, PassContext())  # idempotent
    assert str(gm.graph) == before


def test_canonical_quantize_uses_division_not_reciprocal():
    # E1: PyTorch's decomposed op gives 128, the canonical numerics 127.
    class Q(torch.nn.Module):
        def forward(self, x):
            q = torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.00214854861, 0, 0, 255, torch.uint8)
            return q.to(torch.int32)
    x = torch.tensor([0.273939937])
    gm = graph_module(Q(), x)
    assert gm(x).item() == 128
    PassManager([AttachQParams(), CanonicalizeQDQ()]).run(gm)
    assert gm(x).item() == 127


def test_canonicalize_near_miss_without_qparams_changes_nothing():
    """AttachQParams has not run: no QParams, nothing to canonicalize."""
    x = torch.randn(3, 5)
    gm = graph_module(RequantChain(), x)
    before = str(gm.graph)
    assert not CanonicalizeQDQ().run(gm, PassContext())
    assert str(gm.graph) == before


class RequantToOtherParams(torch.nn.Module):
    """Q -> DQ -> Q with another scale -> DQ: the middle pair changes the values and must stay."""

    def forward(self, x):
        q = qd.quantize_per_tensor(x, 0.05, 10, 0, 255, torch.uint8)
        d = qd.dequantize_per_tensor(q, 0.05, 10, 0, 255, torch.uint8)
        q2 = qd.quantize_per_tensor(d, 0.1, 10, 0, 255, torch.uint8)
        return qd.dequantize_per_tensor(q2, 0.1, 10, 0, 255, torch.uint8)


def test_canonicalize_keeps_a_requantizing_pair():
    x = torch.randn(3, 5)
    gm = graph_module(RequantToOtherParams(), x)
    ref = graph_module(RequantToOtherParams(), x)
    ctx = PassManager([AttachQParams(), CanonicalizeQDQ()]).run(gm)
    t = targets(gm)
    assert t.count(ops.quantize.default) == 2 and t.count(ops.dequantize.default) == 2
    assert not ctx.rewrites["dequantize -> quantize pair removed"]
    assert torch.equal(gm(x), ref(x))
