"""WriteOutReductionDims (onnxruntime legalization): amax / amin over every dim get the dims
written out, aminmax is split, negative dims become non-negative, a 0-d input's reduction is a
clone and its norm an abs (positives, idempotence, values identical, one ONNX Runtime cluster);
reductions over named non-negative dims and a norm of ord 0 are left (near misses)."""
import pytest
import torch

import qlower


class _GlobalMinMax(torch.nn.Module):
    def forward(self, x):
        lo, hi = torch.aminmax(x * 2)
        return torch.amax(torch.relu(x)) - torch.amin(x, dim=(), keepdim=True) + torch.amax(x, dim=1) + hi - lo \
            + torch.amax(x[0, 0]) + torch.amin(x, dim=-1)


def test_explicit_reduction_dims_contract():
    """amax/amin over every dim (empty `dim`) get the dims written out (torchlib's aten_amax needs
    them); a reduction over named dims is a near miss; a second run changes nothing; the values
    are the same before and after, and the whole model runs in ONNX Runtime."""
    from qlower.passes.onnxruntime.write_out_reduction_dims import WriteOutReductionDims
    from qlower.passes import PassContext
    model, x = _GlobalMinMax().eval(), torch.randn(3, 5)
    gm = torch.export.export(model, (x,)).module()
    before = gm(x)
    from qlower.fx import full_args
    dims = lambda: [list(full_args(n)[1]) for n in gm.graph.nodes if n.target in (torch.ops.aten.amax.default,
                                                                                   torch.ops.aten.amin.default)]
    assert dims() == [[], [], [1], [], [-1]]
    ctx = PassContext()
    assert WriteOutReductionDims().run(gm, ctx) is True
    # aminmax became amin + amax over both dims; the 0-d amax became a clone; dim -1 became 1
    # (ONNX Runtime returns an empty input to a negative-axis reduction unchanged)
    assert dims() == [[0, 1], [0, 1], [0, 1], [0, 1], [1], [1]] and sum(ctx.rewrites.values()) == 7
    assert not [n for n in gm.graph.nodes if n.target is torch.ops.aten.aminmax.default]
    assert WriteOutReductionDims().run(gm, PassContext()) is False
    assert torch.equal(gm(x), before)
    cm = qlower.compile(model, (x,), backend="onnxruntime")
    assert [(c.backend, c.status) for c in cm.report().clusters] == [("onnxruntime", "compiled")]
    assert torch.equal(cm(x), model(x))


@pytest.mark.parametrize("ord_", [2, 1, float("inf"), -1, 0.5])
def test_norm_of_a_0d_tensor_is_abs_and_runs_in_onnx_runtime(ord_):
    """torchlib reduces a 0-d tensor over axis 0 ("axis must be in [-rank, rank-1]"): the norm of
    one value is its absolute value for every ord but 0, which is left alone (a near miss)."""
    from qlower.passes.onnxruntime.write_out_reduction_dims import WriteOutReductionDims
    from qlower.passes import PassContext

    class Norm(torch.nn.Module):
        def __init__(self, o):
            super().__init__()
            self.o = o

        def forward(self, x):
            return torch.linalg.vector_norm(x, self.o)
    x = torch.tensor(-3.5)
    gm = torch.export.export(Norm(ord_), (x,)).module()
    assert WriteOutReductionDims().run(gm, PassContext()) is True
    assert WriteOutReductionDims().run(gm, PassContext()) is False
    assert torch.equal(gm(x), Norm(ord_)(x))
    cm = qlower.compile(Norm(ord_), (x,), backend="onnxruntime")
    assert not cm.report().fallbacks and torch.equal(cm(x), Norm(ord_)(x))
    zero = torch.export.export(Norm(0), (x,)).module()
    assert WriteOutReductionDims().run(zero, PassContext()) is False


def test_norm_of_a_0d_tensor_with_a_dtype_casts_then_takes_abs():
    class Norm(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.vector_norm(x, 2, dtype=torch.float64)
    x = torch.tensor(-3.5)
    cm = qlower.compile(Norm(), (x,), backend="onnxruntime")
    out = cm(x)
    assert not cm.report().fallbacks and out.dtype == torch.float64 and torch.equal(out, Norm()(x))
