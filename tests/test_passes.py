import torch

import qlower
from qlower.fx import add_constant

from qdq_models import QDQLinear, graph_module


def test_add_constant_sets_meta():
    gm = graph_module(QDQLinear(), torch.randn(2, 16))
    with gm.graph.inserting_before(next(iter(gm.graph.nodes))):
        node = add_constant(gm, torch.ones(3), "c")
    assert tuple(node.meta["val"].shape) == (3,)


class SliceNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))[:, 4:12])


def test_slice_runs_on_integers_between_lowered_ops():
    from conftest import calib
    torch.manual_seed(0)
    m = SliceNet().eval()
    cm = qlower.compile(m, (torch.randn(2, 16),), quantize="int8", calibration=calib((2, 16)), backend="reference")
    slices = [n for n in cm.graph_module.graph.nodes if n.target == torch.ops.aten.slice.Tensor]
    assert slices and slices[0].meta["val"].dtype == torch.uint8
