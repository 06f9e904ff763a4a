"""DecomposeBlockOps (a backend's legalization): a block op the backend lacks becomes its ATen
decomposition (positive, values within float tolerance, idempotent) while a supported one stays
one node (near miss); under symbolic shapes only size-free decompositions are inlined; the
decomposed op can be recomposed to call its kernel again."""
import torch
from torch import nn

from qlower.blockops import ops as bops
from qdq_models import OpCall as _OpCall

qops = torch.ops.qlower


ONNX_CASES = {   # the two block ops of tests/test_blockops.py's ONNX_CASES these tests use
    "rms_norm": (_OpCall(lambda m, x: bops.rms_norm(x, [8], m.w, 1e-6), w=torch.rand(8) + 0.5),
                 (torch.randn(2, 3, 8),), ("", "RMSNormalization")),
    "rotary_interleaved": (_OpCall(lambda m, x: bops.rotary_embedding(x, m.c, m.s, True), c=torch.rand(5, 8),
                                   s=torch.rand(5, 8)), (torch.randn(1, 2, 5, 8),),
                           ("qlower", "rotary_embedding_interleaved")),
}


def test_decompose_pass_fires_only_for_unsupported_ops_and_keeps_numerics(monkeypatch):
    from qlower.passes import PassContext, PassManager
    from qlower.passes.decompose_block_ops import DecomposeBlockOps
    module, inputs, _ = ONNX_CASES["rotary_interleaved"]
    norm, norm_inputs, _ = ONNX_CASES["rms_norm"]
    for m, xs, target in ((module, inputs, qops.rotary_embedding.default), (norm, norm_inputs, qops.rms_norm.default)):
        gm = torch.export.export(m, xs).module()
        want = gm(*xs)
        unsupported = lambda n: n.target is not qops.rotary_embedding.default
        ctx = PassManager([DecomposeBlockOps(unsupported)]).run(gm, PassContext())
        targets = {n.target for n in gm.graph.nodes}
        if target is qops.rotary_embedding.default:  # positive: decomposed into ATen, same values
            assert target not in targets and ctx.rewrites
            assert torch.allclose(gm(*xs), want, atol=1e-6)
            again = PassManager([DecomposeBlockOps(unsupported)]).run(gm, PassContext())
            assert not again.rewrites  # idempotent
        else:  # near miss: a supported block op stays one node
            assert target in targets and not ctx.rewrites


def test_decompose_pass_under_symbolic_shapes_inlines_only_size_free_decompositions():
    """Batch and sequence dynamic: LayerNorm's decomposition reads no symbolic size (traced with
    prime stand-ins, none among its ops' arguments) and is inlined, with the same values at
    other sizes; causal attention's builds its mask from the sequence length and stays one node
    (refused, with the reason): only what depends on a symbolic size stays in PyTorch."""
    from qlower.passes import PassContext, PassManager
    from qlower.passes.decompose_block_ops import DecomposeBlockOps

    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = nn.Parameter(torch.randn(16)), nn.Parameter(torch.randn(16))

        def forward(self, x):
            y = bops.layer_norm(x, [16], self.w, self.b, 1e-5)
            return bops.attention(y.unsqueeze(1), y.unsqueeze(1), y.unsqueeze(1), None, True, None)
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=64)
    torch.manual_seed(0)
    model = Both().eval()
    gm = torch.export.export(model, (torch.randn(2, 5, 16),), dynamic_shapes=({0: batch, 1: seq},)).module()
    ctx = PassManager([DecomposeBlockOps(lambda n: False)]).run(gm, PassContext())
    targets = {n.target for n in gm.graph.nodes}
    assert qops.layer_norm.default not in targets and qops.attention.default in targets
    assert any("attention" in r.node and "symbolic" in r.reason for r in ctx.refusals)
    assert not PassManager([DecomposeBlockOps(lambda n: False)]).run(gm, PassContext()).rewrites   # idempotent
    for shape in ((1, 2, 16), (3, 7, 16), (2, 33, 16)):
        x = torch.randn(*shape)
        with torch.no_grad():
            torch.testing.assert_close(gm(x), model(x), atol=1e-5, rtol=1e-5)


def test_recompose_calls_the_decomposed_block_op_again_with_its_kernels_bits():
    """A cluster's PyTorch graph (NaN/inf calls, a failed engine) calls a decomposed block op
    again: LayerNorm of a constant row is exactly 0 in the kernel and not in the decomposition
    (its mean an ulp off, times 1/sqrt(eps)) — a difference that gives a NaN input a different
    int8 code on IREE than on the reference backend (found by the differential fuzzer)."""
    from qlower.passes import PassContext, PassManager
    from qlower.passes.decompose_block_ops import DECOMPOSED_FROM, DecomposeBlockOps, recompose_block_ops

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = nn.Parameter(torch.rand(7) + 0.5), nn.Parameter(torch.zeros(7))

        def forward(self, x):
            return bops.layer_norm(x * 3.0, [7], self.w, self.b, 1e-5) + 1.0
    model = Norm().eval()
    x = torch.full((2, 7), 0.1)
    x[1] = torch.randn(7)
    with torch.no_grad():
        want = model(x)
        gm = torch.export.export(model, (x,)).module()
        PassManager([DecomposeBlockOps(lambda n: False)]).run(gm, PassContext())
        decomposed = gm(x)
        assert not torch.equal(decomposed, want)   # the decomposition's roundings differ
        assert recompose_block_ops(gm)                   # positive: one LayerNorm call again
        assert [n.target for n in gm.graph.nodes if n.op == "call_function"].count(qops.layer_norm.default) == 1
        assert not any(DECOMPOSED_FROM in n.meta for n in gm.graph.nodes)
        assert torch.equal(gm(x), want)                  # the kernel's bits
        assert not recompose_block_ops(gm)               # idempotent

        # near misses: a node of the decomposition is not in the graph (another cluster computes
        # it), or a later pass changed one (here its eps; lowering a matmul to an integer op, in
        # an int8 program): the decomposition stays as it is
        for change in ("untag", "rewrite"):
            gm = torch.export.export(model, (x,)).module()
            PassManager([DecomposeBlockOps(lambda n: False)]).run(gm, PassContext())
            tagged = [n for n in gm.graph.nodes if DECOMPOSED_FROM in n.meta]
            if change == "untag":
                del tagged[0].meta[DECOMPOSED_FROM]
            else:
                add = next(n for n in tagged if n.target is torch.ops.aten.add.Tensor and 1e-5 in n.args)
                add.args = (add.args[0], 2e-5)
            assert not recompose_block_ops(gm), change
            assert {n.target for n in gm.graph.nodes}.isdisjoint({qops.layer_norm.default})
