"""dq_through_shape: the mechanics FoldQuantizedConstants and PropagateDequantize share. A shape
op (or a cat) of dequantized values gets the QParams of its result (positive: a per-channel axis
follows a transpose, cat concatenates); ops that are not shape-only, inputs that are not
dequantized, and a reshape merging the channel dim give None or a refusal (near misses); the
helpers only read the graph (calling them twice gives the same answer and changes nothing); and
dequantizing the moved integers equals the shape op of the dequantized values bit for bit."""
import torch

from qlower.fx import constant_value
from qlower.meta import QPARAMS_KEY, QParams
from qlower.passes import AttachQParams, PassContext
from qlower.passes.dq_through_shape import apply_on_integers, constant_inputs, dequantize_node, derived_qparams

from qdq_models import WeightChain, graph_module

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


def _attached(model, *inputs):
    gm = graph_module(model, *inputs)
    AttachQParams().run(gm, PassContext())
    return gm


def _node(gm, target):
    return next(n for n in gm.graph.nodes if n.target == target)


def test_a_transpose_moves_the_channel_axis_and_the_values_stay_bit_identical():
    gm = _attached(WeightChain(lambda w: w.t()), torch.randn(3, 6))
    t = _node(gm, aten.t.default)
    qp = derived_qparams(t)
    dq = t.args[0]
    assert isinstance(qp, QParams) and dq.meta[QPARAMS_KEY].axis == 1 and qp.axis == 0
    assert qp.scale == dq.meta[QPARAMS_KEY].scale
    (w,) = constant_inputs(gm, t)
    moved = apply_on_integers(t, [w])
    assert moved.dtype == torch.int8 and moved.shape == (6, 8)
    scale, zp = constant_value(gm, dq.args[1]), constant_value(gm, dq.args[2])
    after = qd.dequantize_per_channel(moved, scale, zp, qp.axis, qp.qmin, qp.qmax, qp.dtype)
    before = qd.dequantize_per_channel(w, scale, zp, 1, -127, 127, torch.int8).t()
    assert torch.equal(after, before)


def _qdq(x):
    q = qd.quantize_per_tensor(x, 0.05, 3, 0, 255, torch.uint8)
    return qd.dequantize_per_tensor(q, 0.05, 3, 0, 255, torch.uint8)


class CatOfDequantized(torch.nn.Module):
    def forward(self, x, y):
        return torch.cat([_qdq(x), _qdq(y)], 1) * 2


def test_a_cat_of_equal_per_tensor_qparams_keeps_them():
    gm = _attached(CatOfDequantized(), torch.randn(2, 3), torch.randn(2, 4))
    qp = derived_qparams(_node(gm, aten.cat.default))
    assert qp == QParams((0.05,), (3,), 0, 255, torch.uint8)
    assert derived_qparams(_node(gm, aten.mul.Tensor)) is None   # not shape-only, not a cat of dequantizes


def test_near_misses_and_read_only():
    merged = _attached(WeightChain(lambda w: w.reshape(48, 1)), torch.randn(3, 48))
    reshape = _node(merged, aten.reshape.default)
    before = str(merged.graph)
    refusal = derived_qparams(reshape)
    assert isinstance(refusal, str) and "merges the channel dimension" in refusal
    assert derived_qparams(reshape) == refusal and str(merged.graph) == before   # read-only, same answer
    scaled = _attached(WeightChain(lambda w: w * 2), torch.randn(3, 8))
    assert derived_qparams(_node(scaled, aten.mul.Tensor)) is None
    plain = graph_module(torch.nn.Flatten(), torch.randn(2, 3, 4))   # no dequantize in front
    assert all(derived_qparams(n) is None for n in plain.graph.nodes)


def test_dequantize_node_carries_the_qparams_and_the_values():
    gm = _attached(WeightChain(lambda w: w.t()), torch.randn(3, 6))
    t = _node(gm, aten.t.default)
    qp = derived_qparams(t)
    with gm.graph.inserting_before(t):
        new = dequantize_node(gm, t.args[0].args[0], t.args[0].meta[QPARAMS_KEY], like=t.args[0])
    assert new.target is qd.dequantize_per_channel.default and new.meta[QPARAMS_KEY] == t.args[0].meta[QPARAMS_KEY]
    assert qp.per_channel and new.meta["val"].shape == t.args[0].meta["val"].shape
