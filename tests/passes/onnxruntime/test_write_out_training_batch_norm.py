"""WriteOutTrainingBatchNorm (onnxruntime legalization): training-mode batch norm updating the
caller's running statistics, and eval-mode native batch norm's empty saved statistics, written
out in ATen ops with input write-backs (positive, idempotence, values and statistics as eager's,
one cluster); statistics that are module buffers are left (near miss)."""
import torch

import qlower

from conftest import Fn


def _batch_norms(x, w, b, rm, rv, rm2, rv2):
    A = torch.ops.aten
    y = torch.nn.functional.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3, eps=1e-3)
    out, mean, rstd = A.native_batch_norm(x * 2, w, None, rm2, rv2, True, -1.0, 0.5)
    _, *empty = A._native_batch_norm_legit(x, None, b, rm2, rv2, False, 0.5, 1e-5)
    return y, out, mean, rstd, *empty


def test_batch_norm_spelled_out_contract_and_write_backs():
    """WriteOutTrainingBatchNorm: training-mode batch norm updating the caller's running statistics
    (and eval-mode native batch norm's empty saved statistics) written out (positive, idempotent,
    values and updated statistics as eager's); statistics that are module buffers are left
    (near miss). Compiled: one cluster, the updates as input write-backs (status "state")."""
    from qlower.passes.onnxruntime.write_out_training_batch_norm import TARGETS, WriteOutTrainingBatchNorm
    from qlower.passes import PassContext
    x, w, b = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2)
    stats = lambda: [torch.randn(2), torch.rand(2) + 0.2, torch.randn(2), torch.rand(2) + 0.2]
    start = stats()
    gm = torch.export.export(Fn(_batch_norms), (x, w, b, *[s.clone() for s in start])).module()
    want_stats = [s.clone() for s in start]
    want = _batch_norms(x, w, b, *want_stats)
    assert WriteOutTrainingBatchNorm().run(gm, PassContext()) is True
    assert not [n for n in gm.graph.nodes if n.target in TARGETS]
    assert WriteOutTrainingBatchNorm().run(gm, PassContext()) is False
    got_stats = [s.clone() for s in start]
    for g, w_ in zip(gm(x, w, b, *got_stats), want):
        torch.testing.assert_close(g, w_, rtol=1e-5, atol=1e-5)
    for g, w_ in zip(got_stats, want_stats):
        torch.testing.assert_close(g, w_, rtol=1e-6, atol=1e-6)

    cm = qlower.compile(Fn(_batch_norms), (x, w, b, *[s.clone() for s in start]), backend="onnxruntime")
    assert [c.status for c in cm.report().clusters] == ["compiled"] + ["state"] * 4
    got_stats = [s.clone() for s in start]
    for g, w_ in zip(cm(x, w, b, *got_stats), want):
        torch.testing.assert_close(g, w_, rtol=1e-5, atol=1e-5)
    for g, w_ in zip(got_stats, want_stats):
        torch.testing.assert_close(g, w_, rtol=1e-6, atol=1e-6)

    bn = torch.nn.BatchNorm1d(2).train()
    gm = torch.export.export(bn, (x,)).module()
    assert WriteOutTrainingBatchNorm().run(gm, PassContext()) is False
