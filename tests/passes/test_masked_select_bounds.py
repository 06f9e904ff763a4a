"""MaskedSelectBounds: the size bound torch.export asserts on masked_select with a broadcasting
mask is set to the broadcast numel (positive, idempotence, eager's values); a mask of x's own
shape keeps its bound (near miss)."""
import pytest
import torch

import qlower
from qlower.passes import PassContext, PassManager


class SelectsByABroadcastMask(torch.nn.Module):
    def forward(self, x, mask):
        return torch.masked_select(x, mask) * 2


def _bound_of_masked_select(gm) -> list:
    import operator
    return [n.args[1] for n in gm.graph.nodes if n.target is operator.le]


def test_masked_select_bounds():
    """torch.export bounds masked_select's size by self.numel(); a mask that broadcasts x [10] to
    [10, 10] selects up to 100, and the exported program raises on its own example inputs
    ("u0 <= 10"). The pass sets the bound to the broadcast numel; near miss: a mask of x's own
    shape keeps its (right) bound; idempotent; then eager's values, also with every element
    selected (100, the bound itself)."""
    from qlower.passes import MaskedSelectBounds
    x, mask = torch.randn(10), torch.rand(10, 10) > 0.5
    gm = torch.export.export(SelectsByABroadcastMask(), (x, mask)).module()
    assert _bound_of_masked_select(gm) == [10]
    with pytest.raises(RuntimeError, match="u0 <= 10"):
        gm(x, mask)
    assert PassManager([MaskedSelectBounds()]).run(gm, PassContext()).rewrites
    assert _bound_of_masked_select(gm) == [100]
    assert not PassManager([MaskedSelectBounds()]).run(gm, PassContext()).rewrites   # idempotent
    for m in (mask, torch.ones(10, 10, dtype=torch.bool)):
        assert torch.equal(gm(x, m), SelectsByABroadcastMask()(x, m))
    same_shape = torch.export.export(SelectsByABroadcastMask(), (x, mask[0])).module()
    assert not PassManager([MaskedSelectBounds()]).run(same_shape, PassContext()).rewrites
    assert _bound_of_masked_select(same_shape) == [10]
    cm = qlower.compile(SelectsByABroadcastMask(), (x, mask), backend="onnxruntime")
    assert len(cm.report().compiled) == 1 and not cm.report().fallbacks
    assert torch.equal(cm(x, mask), SelectsByABroadcastMask()(x, mask))
