"""backends/cluster_sizes.py: no engine cluster takes or returns a size it can compute itself."""
from __future__ import annotations

import operator

import pytest
import torch
from torch.fx import Graph, GraphModule

from qlower.backends.cluster_sizes import SizeInputError, derive_sizes, is_size, one_user_per_size
from qlower.backends.clusters import fuse_clusters
from qlower.partition import Capability

BATCH, SEQ = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=16)


class SizesAcrossARefusedOp(torch.nn.Module):
    """One size (b * n) read on both sides of the refused cumsum."""

    def forward(self, x):
        b, n = x.shape[0], x.shape[1]
        w = (x * 2).reshape(b * n, -1)
        z = torch.cumsum(torch.relu(x), 1).reshape(b * n, -1)
        return (z + w).relu()


def _exported(model, *xs):
    return torch.export.export(model, xs, dynamic_shapes=tuple({0: BATCH, 1: SEQ} for _ in xs), strict=False)


def _all_but_cumsum() -> Capability:
    cap = Capability("test")
    cap.register("*")
    cap.register("aten::cumsum", lambda n: "refused for the test")
    return cap


def _cluster_calls(fused: GraphModule):
    return [n for n in fused.graph.nodes if n.op == "call_module" and str(n.target).startswith("cluster_")]


def _outputs(sub: GraphModule) -> list:
    out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    return list(out) if isinstance(out, (tuple, list)) else [out]


def test_clusters_around_a_refused_op_neither_take_nor_return_a_size():
    """BEFORE: sizes of x computed in the first cluster, read by the second (and by PyTorch).
    AFTER: every cluster argument and result is a tensor; the program computes the same."""
    gm = _exported(SizesAcrossARefusedOp(), torch.randn(2, 5, 4)).graph_module
    fused, _ = fuse_clusters(gm, _all_but_cumsum(), 1)
    calls = _cluster_calls(fused)
    assert len(calls) == 2
    for call in calls:
        assert all(isinstance(a.meta.get("val"), torch.Tensor) for a in call.all_input_nodes), call.args
        assert all(isinstance(o.meta.get("val"), torch.Tensor) for o in _outputs(getattr(fused, call.target)))
    x = torch.randn(3, 7, 4)
    torch.testing.assert_close(fused(x)[0], SizesAcrossARefusedOp()(x))


def test_one_user_per_size_copies_a_shared_size_and_is_idempotent():
    gm = _exported(SizesAcrossARefusedOp(), torch.randn(2, 5, 4)).graph_module
    shared = [n for n in gm.graph.nodes if is_size(n) and len(n.users) > 1]
    assert shared   # near-miss guard: the model does share a size
    one_user_per_size(gm)
    assert all(len(n.users) <= 1 for n in gm.graph.nodes if is_size(n))
    before = len(gm.graph.nodes)
    one_user_per_size(gm)
    assert len(gm.graph.nodes) == before
    gm.recompile()
    x = torch.randn(3, 7, 4)
    torch.testing.assert_close(gm(x)[0], SizesAcrossARefusedOp()(x))


def _two_input_symbols():
    """(val of a (s0, 4) tensor, val of a (s1, 4) tensor), from an exported program."""
    class Two(torch.nn.Module):
        def forward(self, a, b):
            return a.sum() + b.sum()
    ep = torch.export.export(Two(), (torch.randn(3, 4), torch.randn(5, 4)),
                             dynamic_shapes=({0: torch.export.Dim("p", max=9)}, {0: torch.export.Dim("q", max=9)}),
                             strict=False)
    return [n.meta["val"] for n in ep.graph.nodes if n.op == "placeholder"]


def _cluster_taking(x_val, n_val) -> GraphModule:
    """A cluster `new_zeros(x, [n])` whose size n is an input."""
    g = Graph()
    x, n = g.placeholder("x"), g.placeholder("n")
    x.meta["val"], n.meta["val"] = x_val, n_val
    g.output(g.call_function(torch.ops.aten.new_zeros.default, (x, [n])))
    return GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("twice", [False, True])
def test_a_size_input_becomes_sym_size_of_a_tensor_input(twice):
    a, _ = _two_input_symbols()
    s0 = a.shape[0]
    sub = _cluster_taking(a, 2 * s0 if twice else s0)
    left = derive_sizes(sub, ["outer_x", "outer_n"])
    assert left == ["outer_x"]
    assert [n.name for n in sub.graph.nodes if n.op == "placeholder"] == ["x"]
    assert any(n.target is torch.ops.aten.sym_size.int for n in sub.graph.nodes)
    assert any(n.target is operator.mul for n in sub.graph.nodes) == twice
    assert sub(torch.randn(3, 4)).shape == ((6,) if twice else (3,))
    assert derive_sizes(sub, left) == left   # idempotent: nothing left to derive


def test_a_size_of_another_tensor_is_not_derived():
    """Near miss: s0 * s1 where the cluster sees only s0: SizeInputError, the cluster unchanged."""
    a, b = _two_input_symbols()
    sub = _cluster_taking(a, a.shape[0] * b.shape[0])
    code = sub.code
    with pytest.raises(SizeInputError, match="neither a dim of a tensor input"):
        derive_sizes(sub, ["outer_x", "outer_n"])
    assert sub.code == code
