"""ReplaceAliasOps (onnxruntime legalization): ATen's alias ops (divide, subtract, multiply,
true_divide) become the ops they alias (positive, idempotence, values identical, one cluster);
the canonical ops are left (near miss)."""
import torch

import qlower
from qlower.passes import PassContext
from qlower.passes.onnxruntime.replace_alias_ops import ReplaceAliasOps


class _Aliases(torch.nn.Module):
    def forward(self, x, n):
        return torch.multiply(torch.subtract(torch.divide(x, n), x, alpha=2), 3.0) + torch.true_divide(n, 2)


def test_alias_ops_become_the_ops_they_alias():
    """torch.divide of a float by an int64 tensor stays `aten.divide`, which torch.onnx's type
    promotion does not know: Div(float, int64), rejected by ONNX Runtime (OpInfo's masked.std),
    and the whole cluster would run in PyTorch. Positive case, idempotence, values identical, one
    cluster."""
    from qlower.passes.onnxruntime.replace_alias_ops import ALIASES, ReplaceAliasOps
    from qlower.passes import PassContext
    args = (torch.randn(3, 4), torch.tensor([1, 2, 3, 4]))
    gm = torch.export.export(_Aliases(), args).module()
    before = gm(*args)
    aliases = lambda: [n.target for n in gm.graph.nodes if n.target in ALIASES]
    assert len(aliases()) == 4
    assert ReplaceAliasOps().run(gm, PassContext()) is True
    assert not aliases() and ReplaceAliasOps().run(gm, PassContext()) is False
    assert torch.equal(gm(*args), before)
    cm = qlower.compile(_Aliases(), args, backend="onnxruntime")
    assert [c.status for c in cm.report().clusters] == ["compiled"]
    torch.testing.assert_close(cm(*args), _Aliases()(*args))


class _Canonical(torch.nn.Module):
    def forward(self, x, n):
        return torch.mul(torch.sub(torch.div(x, n), x, alpha=2), 3.0) + torch.div(n, 2)


def test_canonical_ops_are_left_alone():
    args = (torch.randn(3, 4), torch.tensor([1, 2, 3, 4]))
    gm = torch.export.export(_Canonical(), args).module()
    before, want = str(gm.graph), gm(*args)
    assert not ReplaceAliasOps().run(gm, PassContext())
    assert str(gm.graph) == before and torch.equal(gm(*args), want)
