"""MatrixTransposeAsTranspose (iree legalization): mT / mH / adjoint of a real tensor become
transpose(-2, -1) (positive, idempotence, eager's values, one IREE cluster); a complex input is
left (near miss)."""
import pytest
import torch

import qlower

from conftest import Fn


class _MatrixTransposes(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x.mT @ x) + x.mH.sum() + x.adjoint()


def test_matrix_transposes_contract():
    """mT / mH / adjoint (torch-mlir leaves them as an illegal `torch.operator`: the whole cluster
    would run in PyTorch) become transpose(-2, -1): one IREE cluster, eager's values; a complex
    input is a near miss (a conjugate too); a second run changes nothing."""
    from qlower.passes.iree.matrix_transpose_as_transpose import MatrixTransposeAsTranspose
    from qlower.passes import PassContext
    model, x = _MatrixTransposes(), torch.randn(3, 4, 4)
    gm = torch.export.export(model, (x,)).module()
    assert MatrixTransposeAsTranspose().run(gm, PassContext()) is True
    assert not [n for n in gm.graph.nodes if n.target in (torch.ops.aten.mT.default, torch.ops.aten.mH.default,
                                                          torch.ops.aten.adjoint.default)]
    assert MatrixTransposeAsTranspose().run(gm, PassContext()) is False
    assert torch.equal(gm(x), model(x))
    complex_gm = torch.export.export(Fn(lambda z: z.mH * 2), (torch.randn(2, 3, dtype=torch.complex64),)).module()
    assert MatrixTransposeAsTranspose().run(complex_gm, PassContext()) is False
    pytest.importorskip("iree.compiler", reason="the iree extra is not installed")
    pytest.importorskip("iree.runtime", reason="the iree extra is not installed")
    cm = qlower.compile(model, (x,), backend="iree")
    assert [(c.backend, c.status) for c in cm.report().clusters] == [("iree", "compiled")], str(cm.report())
    torch.testing.assert_close(cm(x), model(x))
