import operator

import pytest
import torch

import qlower
from qlower.fx import is_dequantize, is_quantize
from qlower.quantize import QuantConfig, is_quantized

from conftest import calib

qd = torch.ops.quantized_decomposed


def _targets(ep):
    return [n.target for n in ep.graph.nodes if n.op == "call_function"]


def test_default_scheme_uint8_activations_int8_per_channel_weights(small_net):
    ep = qlower.quantize(small_net, (torch.randn(1, 3, 8, 8),), calib((1, 3, 8, 8)))
    nodes = list(ep.graph.nodes)
    acts = [n for n in nodes if n.target == qd.quantize_per_tensor.default]
    assert acts and all(n.args[5] == torch.uint8 and (n.args[3], n.args[4]) == (0, 255) for n in acts)
    weights = [n for n in nodes if n.target == qd.dequantize_per_channel.default and n.args[6] == torch.int8]
    assert len(weights) == 3 and all((n.args[4], n.args[5]) == (-127, 127) for n in weights)
    biases = [n for n in nodes if n.target == qd.dequantize_per_channel.default and n.args[6] == torch.int32]
    assert len(biases) == 2  # conv (bias) and fc; conv2 has none


def test_per_tensor_weights_and_int8_symmetric_activations(small_net):
    cfg = QuantConfig(activation_dtype="int8", per_channel=False)
    ep = qlower.quantize(small_net, (torch.randn(1, 3, 8, 8),), calib((1, 3, 8, 8)), config=cfg)
    acts = [n for n in ep.graph.nodes if n.target == qd.quantize_per_tensor.default]
    assert all(n.args[5] == torch.int8 and n.args[2] == 0 for n in acts)
    assert qd.dequantize_per_channel.default not in _targets(ep)


@pytest.mark.parametrize("observer", ["histogram", "percentile"])
def test_other_observers_produce_tighter_or_equal_ranges(small_net, observer):
    data = calib((1, 3, 8, 8))
    data[0][0][0, 0, 0, 0] = 60.0  # one outlier
    x = (torch.randn(1, 3, 8, 8),)
    minmax = qlower.quantize(small_net, x, data)
    other = qlower.quantize(small_net, x, data, config=QuantConfig(observer=observer, percentile=99.0))
    scale = lambda ep: next(n.args[1] for n in ep.graph.nodes if n.target == qd.quantize_per_tensor.default)
    assert scale(other) < scale(minmax)


def test_already_quantized_program_is_accepted_as_is(small_net):
    x = (torch.randn(1, 3, 8, 8),)
    ep = qlower.quantize(small_net, x, calib((1, 3, 8, 8)))
    assert is_quantized(ep)
    assert qlower.quantize(ep, x) is ep
    cm = qlower.compile(ep, x, quantize="int8", backend="reference")  # no calibration needed
    assert cm.report().quantized


def test_shared_qparams_for_range_preserving_ops(small_net):
    ep = qlower.quantize(small_net, (torch.randn(1, 3, 8, 8),), calib((1, 3, 8, 8)))
    pool = next(n for n in ep.graph.nodes if n.target == torch.ops.aten.max_pool2d.default)
    before, after = pool.args[0], next(iter(pool.users))
    assert is_dequantize(before) and is_quantize(after)
    assert before.args[1:] == after.args[1:]


def test_quantize_without_calibration_is_typed(small_net):
    with pytest.raises(qlower.QuantizeError, match="calibration"):
        qlower.quantize(small_net, (torch.randn(1, 3, 8, 8),))
    with pytest.raises(qlower.QuantizeError, match="calibration"):
        qlower.compile(small_net, (torch.randn(1, 3, 8, 8),), quantize="int8")
    with pytest.raises(qlower.QuantizeError, match="empty"):
        qlower.quantize(small_net, (torch.randn(1, 3, 8, 8),), [])


def test_bad_config_is_typed():
    with pytest.raises(qlower.QuantizeError):
        QuantConfig(observer="magic")
    with pytest.raises(qlower.QuantizeError):
        QuantConfig.from_name("int3")


class CatSelf(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return torch.cat([y, y], dim=-1)  # as transformers' rotary embedding does


def test_concat_of_the_same_value_twice_quantizes():
    """Regression: cat([y, y]) made y share qparams with itself (an infinite sharing cycle in
    PT2E's prepare, seen as a RecursionError on transformers' LLaMA)."""
    x = (torch.randn(2, 8),)
    ep = qlower.quantize(CatSelf().eval(), x, [x, (torch.randn(2, 8),)])
    assert any(n.target == torch.ops.aten.cat.default for n in ep.graph.nodes)


class NormLike(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.a(x)
        var = y.pow(2).mean(-1, keepdim=True) + 1e-6   # x + scalar: stays float
        return self.b(y * torch.rsqrt(var)) + y        # mul: float unless quantize_mul; add: quantized


@pytest.mark.parametrize("quantize_mul", [False, True])
def test_elementwise_annotation_rules(quantize_mul):
    from qlower.fx import is_quantize as isq
    x = (torch.randn(2, 8),)
    cfg = QuantConfig(quantize_mul=quantize_mul)
    ep = qlower.quantize(NormLike().eval(), x, [x, (torch.randn(2, 8),)], config=cfg)
    mul = next(n for n in ep.graph.nodes if n.target == torch.ops.aten.mul.Tensor)
    assert all(is_dequantize(a) for a in mul.args) == quantize_mul  # a quantized mul reads DQ'd inputs
    adds = [n for n in ep.graph.nodes if n.target == torch.ops.aten.add.Tensor]
    scalar_add = next(n for n in adds if not isinstance(n.args[1], torch.fx.Node))
    tensor_add = next(n for n in adds if isinstance(n.args[1], torch.fx.Node))
    assert not any(isq(u) for u in scalar_add.users)
    assert any(isq(u) for u in tensor_add.users)


def test_pieces_of_a_fused_projection_share_its_qparams():
    """q, k, v from one linear (reshape -> permute -> unbind) run on its integers: the integer
    matmuls read the unbind pieces directly, with no requantization in between."""
    from qlower import zoo
    entry = zoo.get("transformer")
    cm = qlower.compile(entry.model(), entry.inputs(1), quantize="int8", calibration=entry.calibration(2),
                        backend="reference")
    nodes = list(cm.graph_module.graph.nodes)
    unbinds = [n for n in nodes if n.target == torch.ops.aten.unbind.int]
    assert unbinds and all(u.args[0].meta["val"].dtype == torch.uint8 for u in unbinds)
    matmuls = [n for n in nodes if n.target == torch.ops.qlower.matmul.default]
    qk = [m for m in matmuls if m.args[0].target is operator.getitem]
    assert len(qk) == len(unbinds)  # q @ k^T consumes the unbind piece itself
