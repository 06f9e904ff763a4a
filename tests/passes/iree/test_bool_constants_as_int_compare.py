"""BoolConstantsAsIntCompare (iree legalization): boolean tensors created from sizes and a value
are created as int32 and compared with 0 (positive, values bit for bit, idempotence, one IREE
cluster); zeros of bool and creation ops of other dtypes are left (near misses)."""
import pytest
import torch

import qlower
from qlower.passes import PassContext
from qlower.passes.iree.bool_constants_as_int_compare import BoolConstantsAsIntCompare


class _BooleanConstants(torch.nn.Module):
    def forward(self, x, m):
        made = (m.new_ones((2, 1, 4), dtype=torch.bool), torch.full((2, 1, 4), True),
                torch.ones_like(m[:, None, :] > 0),
                torch.full_like(m[:, None, :] > 0, False), torch.zeros(2, 1, 4, dtype=torch.bool))
        mask = made[0] & made[1] & made[2] & ~made[3] & ~made[4] & (m[:, None, :] > 0)
        return x.masked_fill(mask, -1.0)


def test_boolean_constants_pass_contract():
    """Positive (new_ones / full / ones_like / full_like with bool results, fill values
    True/False), near misses (zeros of bool: compiles as it is; int creation ops), values bit
    for bit, idempotence; then on IREE: one cluster, equal to eager."""
    from qlower.passes.iree.bool_constants_as_int_compare import BoolConstantsAsIntCompare
    from qlower.passes import PassContext, PassManager
    x, m = torch.randn(2, 4, 4), torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    gm = torch.export.export(_BooleanConstants(), (x, m)).module()
    want = gm(x, m)
    ctx = PassManager([BoolConstantsAsIntCompare()]).run(gm, PassContext())
    assert sum(ctx.rewrites.values()) == 4
    created = [n for n in gm.graph.nodes if n.op == "call_function" and "zeros" not in str(n.target)
               and n.target in (torch.ops.aten.new_ones.default, torch.ops.aten.full.default,
                                torch.ops.aten.ones_like.default, torch.ops.aten.full_like.default)]
    assert len(created) == 4 and all(n.meta["val"].dtype is torch.int32 for n in created)
    assert torch.equal(gm(x, m), want)
    assert not PassManager([BoolConstantsAsIntCompare()]).run(gm, PassContext()).rewrites   # idempotent
    pytest.importorskip("iree.compiler", reason="the iree extra is not installed")
    pytest.importorskip("iree.runtime", reason="the iree extra is not installed")
    cm = qlower.compile(_BooleanConstants(), (x, m), backend="iree")
    assert len(cm.report().compiled) == 1 and not cm.report().fallbacks
    assert torch.equal(cm(x, m), _BooleanConstants()(x, m))


class _OtherCreations(torch.nn.Module):
    def forward(self, x, m):
        made = (torch.zeros(2, 1, 4, dtype=torch.bool), m.new_ones((2, 1, 4)), torch.full((2, 1, 4), 3.0),
                torch.ones_like(x))
        return x.masked_fill(made[0] | (m[:, None, :] > 0), -1.0) * made[1] + made[2] + made[3]


def test_boolean_constants_near_misses_stay():
    x, m = torch.randn(2, 4, 4), torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    gm = torch.export.export(_OtherCreations(), (x, m)).module()
    before, want = str(gm.graph), gm(x, m)
    assert not BoolConstantsAsIntCompare().run(gm, PassContext())
    assert str(gm.graph) == before and torch.equal(gm(x, m), want)
