"""Quantization-aware folding: the shared axis helper and the end-to-end TICO #499 patterns (the
passes' own tests: tests/passes/test_fold_quantized_constants.py, test_propagate_dequantize.py,
test_fold_float_constants.py)."""
import pytest
import torch
import torch.nn.functional as F

import qlower
from qlower.axis import derive, derive_concat, derive_split
from qlower.meta import QPARAMS_KEY, QParams
from qlower.passes import (AttachQParams, FoldQuantizedConstants, PassManager,
                           PropagateDequantize, default_pipeline)
from qlower.fx import constant_value

from conftest import calib

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


def pc(n, axis, dtype=torch.int8):
    return QParams(tuple(float(i + 1) for i in range(n)), (0,) * n, -127, 127, dtype, axis)


PT = QParams((0.5,), (3,), -128, 127, torch.int8, None)


# ---------------------------------------------------------------- the shared helper
@pytest.mark.parametrize("target,args,shape,qp,axis", [
    (aten.permute.default, ([1, 2, 0],), (3, 4, 5), pc(3, 0), 2),
    (aten.permute.default, ([2, 0, 1],), (3, 4, 5), pc(5, 2), 0),
    (aten.transpose.int, (0, 1), (3, 4), pc(3, 0), 1),
    (aten.t.default, (), (3, 4), pc(4, 1), 0),
    (aten.reshape.default, ([3, 20],), (3, 4, 5), pc(3, 0), 0),
    (aten.reshape.default, ([1, 3, 1, 20],), (3, 4, 5), pc(3, 0), 1),
    (aten.view.default, ([2, 4, 5, 1],), (2, 4, 5), pc(4, 1), 1),
    (aten.flatten.using_ints, (1, -1), (3, 4, 5), pc(3, 0), 0),
    (aten.unflatten.int, (1, [2, 2]), (3, 4), pc(3, 0), 0),
    (aten.unsqueeze.default, (0,), (3, 4), pc(3, 0), 1),
    (aten.unsqueeze.default, (-1,), (3, 4), pc(4, 1), 1),
    (aten.squeeze.dim, (1,), (3, 1, 4), pc(4, 2), 1),
    (aten.expand.default, ([2, 3, 4],), (3, 4), pc(3, 0), 1),
    (aten.repeat.default, ([2, 1, 1],), (3, 4), pc(3, 0), 1),
])
def test_axis_moves(target, args, shape, qp, axis):
    out = derive(target, args, shape, qp)
    assert isinstance(out, QParams) and out.axis == axis and out.scale == qp.scale


@pytest.mark.parametrize("target,args,shape,qp,reason", [
    (aten.reshape.default, ([12, 5],), (3, 4, 5), pc(3, 0), "merges"),
    (aten.reshape.default, ([2, 2, 2, 5],), (2, 4, 5), pc(4, 1), "splits"),
    (aten.flatten.using_ints, (0, 1), (3, 4, 5), pc(3, 0), "merges"),
    (aten.expand.default, ([2, 4, 5],), (2, 1, 5), pc(1, 1), "broadcasts"),
    (aten.repeat.default, ([1, 2, 1],), (2, 4, 5), pc(4, 1), "replicates"),
    (aten.squeeze.dim, (0,), (1, 4), QParams((1.0,), (0,), -127, 127, torch.int8, 0), None),
])
def test_near_misses_refuse(target, args, shape, qp, reason):
    out = derive(target, args, shape, qp)
    if reason is None:  # squeezing a 1-channel axis is allowed: it becomes per-tensor
        assert isinstance(out, QParams) and not out.per_channel
    else:
        assert isinstance(out, str) and reason in out


def test_slicing_ops_slice_qparams():
    qp = pc(6, 1)
    assert derive(aten.slice.Tensor, (1, 1, 5, 2), (2, 6), qp).scale == (2.0, 4.0)
    assert derive(aten.narrow.default, (1, 2, 3), (2, 6), qp).scale == (3.0, 4.0, 5.0)
    sel = derive(aten.select.int, (1, 4), (2, 6), qp)
    assert not sel.per_channel and sel.scale == (5.0,)
    assert derive(aten.select.int, (0, 1), (2, 6), qp).axis == 0
    assert derive(aten.index_select.default, (1, torch.tensor([5, 0])), (2, 6), qp).scale == (6.0, 1.0)
    assert derive(aten.flip.default, ([1],), (2, 6), qp).scale == (6.0, 5.0, 4.0, 3.0, 2.0, 1.0)
    assert derive(aten.slice.Tensor, (0, 0, 1), (2, 6), qp) == qp


def test_per_tensor_passes_through_everything():
    for target, args in [(aten.reshape.default, ([12],)), (aten.permute.default, ([1, 0],)),
                         (aten.expand.default, ([2, 3, 4],))]:
        assert derive(target, args, (3, 4), PT) == PT


def test_concat_and_split():
    a, b = pc(2, 0), QParams((7.0, 8.0, 9.0), (0, 0, 0), -127, 127, torch.int8, 0)
    cat = derive_concat([a, b], 0, [(2, 4), (3, 4)])
    assert cat.scale == (1.0, 2.0, 7.0, 8.0, 9.0)
    assert isinstance(derive_concat([a, b], 1, [(2, 4), (3, 4)]), str)
    assert derive_concat([PT, PT], 1, [(2, 4), (2, 4)]) == PT
    assert [q.scale for q in derive_split(cat, 0, [2, 3], 2)] == [a.scale, b.scale]
    assert derive(aten.add.Tensor, (), (3,), PT) == "add.Tensor is not a shape-only op"


# ---------------------------------------------------------------- end to end (TICO #499)
class Decomposed(torch.nn.Module):
    """conv1d, a linear written as x @ w.t(), and a depthwise conv whose weight is stored HWIO
    and permuted in forward, after a permute-based layout change of the activation."""

    def __init__(self):
        super().__init__()
        self.conv1d = torch.nn.Conv1d(4, 8, 3, padding=1)
        self.w = torch.nn.Parameter(torch.randn(16, 8 * 6) * 0.1)
        self.dw_hwio = torch.nn.Parameter(torch.randn(3, 3, 1, 16) * 0.3)

    def forward(self, x):                               # x: [N, 4, 6]
        y = torch.relu(self.conv1d(x))                  # [N, 8, 6]
        y = y.flatten(1) @ self.w.t()                   # [N, 16]
        img = y.reshape(-1, 4, 4, 1).expand(-1, 4, 4, 16)  # NHWC
        img = img.permute(0, 3, 1, 2)                   # NCHW
        return F.conv2d(img, self.dw_hwio.permute(3, 2, 0, 1), padding=1, groups=16)


def test_end_to_end_decomposed_model_folds_and_lowers():
    torch.manual_seed(0)
    model = Decomposed().eval()
    x = torch.randn(2, 4, 6)
    ep = qlower.quantize(model, (x,), calib((2, 4, 6)))
    unfolded = ep.module()
    gm = ep.module()
    ctx = PassManager(default_pipeline()).run(gm)
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    for integer_op in (torch.ops.qlower.conv1d.default, torch.ops.qlower.linear.default,
                       torch.ops.qlower.conv2d.default):
        assert integer_op in ops, ctx.refusals
    # every weight reaches its integer op as a folded int8 constant, per-channel on axis 0
    for node in gm.graph.nodes:
        if node.target in (torch.ops.qlower.linear.default, torch.ops.qlower.conv2d.default):
            w = node.args[2]
            assert w.op == "get_attr" and constant_value(gm, w).dtype == torch.int8
            assert len(node.meta[QPARAMS_KEY].scale) == constant_value(gm, w).shape[0]
    # folding alone is value-preserving: folded Q/DQ graph == unfolded Q/DQ graph bit-exactly
    only_folded = ep.module()
    PassManager([AttachQParams(), FoldQuantizedConstants(), PropagateDequantize()]).run(only_folded)
    assert not any(n.target in (aten.t.default, aten.permute.default) and n.args[0].op == "call_function"
                   and n.args[0].target == qd.dequantize_per_channel.default for n in only_folded.graph.nodes)
    for seed in range(4):
        xs = calib((2, 4, 6), n=1, seed=seed)[0]
        assert torch.equal(only_folded(*xs), unfolded(*xs))
    assert qlower.report.sqnr_db(model(x), gm(x)) > 20
