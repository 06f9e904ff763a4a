"""NameBitwiseOperators (iree legalization): `&` and `^` (aten.__and__ / __xor__, tensor and
scalar forms) become bitwise_and / bitwise_xor (positive, values bit for bit, idempotence, one
IREE cluster); `|`, logical_and and bitwise ops already named are left (near misses)."""
import pytest
import torch

import qlower
from qlower.passes import PassContext
from qlower.passes.iree.name_bitwise_operators import NameBitwiseOperators


class _IntegerBitwise(torch.nn.Module):
    def forward(self, i, j):
        return (i & j) ^ (i & 6) ^ (j ^ 3) ^ torch.bitwise_xor(i, 5) ^ (i | j)


def test_bitwise_operators_pass_contract():
    """Positive (`&`, `^`, tensor and scalar forms, integers), near misses (`|`, bitwise_and
    already), values bit for bit, idempotence; then on IREE: one cluster, equal to eager
    (`bitwise_xor.Scalar` fails in iree-compile like `__xor__`: a 0-d constant operand)."""
    from qlower.passes.iree.name_bitwise_operators import NameBitwiseOperators
    from qlower.passes import PassContext, PassManager
    i, j = torch.randint(-50, 50, (2, 8)), torch.randint(-50, 50, (2, 8))
    gm = torch.export.export(_IntegerBitwise(), (i, j)).module()
    want = gm(i, j)
    ctx = PassManager([NameBitwiseOperators()]).run(gm, PassContext())
    assert sum(ctx.rewrites.values()) == 8   # 2 __and__, 4 __xor__.Tensor, __xor__.Scalar, bitwise_xor.Scalar
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    aten = torch.ops.aten
    assert not targets & {aten.__and__.Tensor, aten.__and__.Scalar, aten.__xor__.Tensor, aten.__xor__.Scalar,
                          aten.bitwise_xor.Scalar}
    assert aten.__or__.Tensor in targets   # `|` compiles as it is: left alone
    assert torch.equal(gm(i, j), want)
    assert not PassManager([NameBitwiseOperators()]).run(gm, PassContext()).rewrites   # idempotent
    pytest.importorskip("iree.compiler", reason="the iree extra is not installed")
    pytest.importorskip("iree.runtime", reason="the iree extra is not installed")
    cm = qlower.compile(_IntegerBitwise(), (i, j), backend="iree")
    assert len(cm.report().compiled) == 1 and not cm.report().fallbacks
    assert torch.equal(cm(i, j), _IntegerBitwise()(i, j))


class _NamedAlready(torch.nn.Module):
    def forward(self, i, j):
        return torch.bitwise_and(i, j) | torch.bitwise_xor(i, j) | (i | 6), torch.logical_and(i > 0, j > 0)


def test_bitwise_operators_near_misses_stay():
    i, j = torch.randint(-50, 50, (2, 8)), torch.randint(-50, 50, (2, 8))
    gm = torch.export.export(_NamedAlready(), (i, j)).module()
    before, want = str(gm.graph), gm(i, j)
    assert not NameBitwiseOperators().run(gm, PassContext())
    assert str(gm.graph) == before and all(torch.equal(a, b) for a, b in zip(gm(i, j), want))
