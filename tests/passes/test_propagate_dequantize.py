"""PropagateDequantize: a dequantize of a non-constant integer tensor moves below shape-only ops
(reshape / permute, and unbind with one dequantize per piece), values unchanged, idempotent; an
unbind of a float tensor that was never quantized is left (near miss)."""
import torch

from qlower.meta import QPARAMS_KEY
from qlower.passes import AttachQParams, PassContext, PropagateDequantize

from qdq_models import folded, graph_module

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


class ActivationReshape(torch.nn.Module):
    def forward(self, x):
        q = qd.quantize_per_tensor(x, 0.05, 128, 0, 255, torch.uint8)
        d = qd.dequantize_per_tensor(q, 0.05, 128, 0, 255, torch.uint8)
        return d.reshape(2, -1).permute(1, 0)


def test_propagate_dequantize_moves_dq_below_shape_ops():
    x = torch.randn(2, 3, 4)
    gm, ctx = folded(ActivationReshape(), x, [AttachQParams(), PropagateDequantize()])
    order = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert order[-1] == qd.dequantize_per_tensor.default  # the DQ is now last
    assert order.index(aten.reshape.default) < order.index(qd.dequantize_per_tensor.default)
    assert torch.equal(gm(x), graph_module(ActivationReshape(), x)(x))
    assert not PropagateDequantize().run(gm, PassContext())


class ActivationUnbind(torch.nn.Module):
    def forward(self, x):
        q = qd.quantize_per_tensor(x, 0.05, 128, 0, 255, torch.uint8)
        d = qd.dequantize_per_tensor(q, 0.05, 128, 0, 255, torch.uint8)
        a, b, c = d.unbind(1)
        return a + b * c


class ActivationUnbindNearMiss(torch.nn.Module):
    """unbind of a float tensor that was never quantized: nothing to move."""
    def forward(self, x):
        a, b = x.unbind(0)
        return a * b


def test_propagate_dequantize_moves_dq_below_unbind():
    x = torch.randn(2, 3, 4)
    gm, ctx = folded(ActivationUnbind(), x, [AttachQParams(), PropagateDequantize()])
    unbind = next(n for n in gm.graph.nodes if n.target == aten.unbind.int)
    assert unbind.args[0].target == qd.quantize_per_tensor.default  # runs on the integers
    pieces = [n for n in gm.graph.nodes if n.target == qd.dequantize_per_tensor.default]
    assert len(pieces) == 3 and all(p.meta[QPARAMS_KEY].scale == (0.05,) for p in pieces)
    assert torch.equal(gm(x), graph_module(ActivationUnbind(), x)(x))
    before = str(gm.graph)
    assert not PropagateDequantize().run(gm, PassContext())  # idempotent
    assert str(gm.graph) == before


def test_propagate_dequantize_leaves_float_unbind_alone():
    x = torch.randn(2, 5)
    gm, ctx = folded(ActivationUnbindNearMiss(), x, [AttachQParams(), PropagateDequantize()])
    assert not ctx.rewrites
    assert next(n for n in gm.graph.nodes if n.target == aten.unbind.int).args[0].op == "placeholder"
