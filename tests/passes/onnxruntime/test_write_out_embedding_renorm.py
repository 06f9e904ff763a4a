"""WriteOutEmbeddingRenorm (onnxruntime legalization): embedding with max_norm, which renormalizes
the caller's weight in place, is written out with the renormalized weight as an input
write-back (positive, idempotence, the lookup and the caller's weight as before the rewrite and
as eager's, one cluster); a renorm of a module parameter is left (near miss)."""
import torch

import qlower
from qlower.passes import PassContext
from qlower.passes.onnxruntime.write_out_embedding_renorm import WriteOutEmbeddingRenorm

from conftest import Fn


def test_embedding_renorm_spelled_out_contract_and_write_back():
    """WriteOutEmbeddingRenorm: embedding with max_norm renormalizes the caller's weight in
    place (positive: one cluster, the renormalized weight as an input write-back, the caller's
    weight and the lookup as eager's, rows not looked up untouched; idempotent); a renorm of a
    module parameter (not a graph input) is left (near miss)."""
    from qlower.passes.onnxruntime.write_out_embedding_renorm import WriteOutEmbeddingRenorm
    from qlower.passes import PassContext
    fn = lambda w, i: torch.nn.functional.embedding(i, w, max_norm=1.0, norm_type=1.0) * 2
    w, i = torch.randn(6, 4), torch.tensor([[0, 2], [4, 2]])
    gm = torch.export.export(Fn(fn), (w.clone(), i)).module()
    assert WriteOutEmbeddingRenorm().run(gm, PassContext()) is True
    assert WriteOutEmbeddingRenorm().run(gm, PassContext()) is False
    cm = qlower.compile(Fn(fn), (w.clone(), i), backend="onnxruntime")
    assert [c.status for c in cm.report().clusters] == ["compiled", "state"]
    ours, eager = w.clone(), w.clone()
    torch.testing.assert_close(cm(ours, i), fn(eager, i), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours, eager, rtol=1e-6, atol=1e-6)
    assert not torch.equal(ours, w) and torch.equal(ours[[1, 3, 5]], w[[1, 3, 5]])
    module = torch.nn.Embedding(6, 4, max_norm=1.0)
    gm = torch.export.export(module, (i,)).module()
    assert WriteOutEmbeddingRenorm().run(gm, PassContext()) is False


def _renorm_lookup(w, i):
    return torch.nn.functional.embedding(i, w, max_norm=1.0, norm_type=2.0) * 2


def test_embedding_renorm_written_out_keeps_the_graphs_values_and_write_back():
    """The graph before and after the rewrite, on random weights (rows above and below the norm):
    the same lookups, and the same renormalized weight left in the caller's tensor."""
    i = torch.tensor([[0, 2], [4, 2], [5, 5]])
    for seed in range(3):
        w = torch.randn(6, 4, generator=torch.Generator().manual_seed(seed)) * 0.7
        before = torch.export.export(Fn(_renorm_lookup), (w.clone(), i)).module()
        after = torch.export.export(Fn(_renorm_lookup), (w.clone(), i)).module()
        assert WriteOutEmbeddingRenorm().run(after, PassContext())
        assert not any(n.target is torch.ops.aten.embedding_renorm_.default for n in after.graph.nodes)
        ours, theirs = w.clone(), w.clone()
        torch.testing.assert_close(after(ours, i), before(theirs, i), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
        assert not torch.equal(ours, w)
