"""Clustering on synthetic graphs, allow/deny lists."""

import torch
from torch.fx import Graph

from qlower.partition import Capability, cluster_graph


def capability(*supported):
    cap = Capability("test")
    cap.register(list(supported))
    return cap


def chain_graph(ops):
    g = Graph()
    x = g.placeholder("x")
    for op in ops:
        x = g.call_function(op, (x,))
    g.output(x)
    return g


aten = torch.ops.aten


def short(node):
    return node.name.removesuffix("_default").removesuffix("_tensor")


def names(clustering):
    return [[short(n) for n in c] for c in clustering.clusters]


def test_chain_is_one_cluster():
    g = chain_graph([aten.relu.default, aten.sigmoid.default, aten.tanh.default])
    c = cluster_graph(g, capability("aten::relu", "aten::sigmoid", "aten::tanh"))
    assert names(c) == [["relu", "sigmoid", "tanh"]]


def test_supported_unsupported_supported_splits_in_two():
    g = chain_graph([aten.relu.default, aten.sigmoid.default, aten.tanh.default])
    c = cluster_graph(g, capability("aten::relu", "aten::tanh"))
    assert names(c) == [["relu"], ["tanh"]]
    assert "no lowering for aten::sigmoid" in c.unsupported["sigmoid_default"]


def test_diamond_with_unsupported_branch_does_not_create_a_cycle():
    # a -> b(unsupported) -> d ; a -> c -> d : merging a, c, d would make the cluster both
    # feed and consume b.
    g = Graph()
    x = g.placeholder("x")
    a = g.call_function(aten.relu.default, (x,))
    b = g.call_function(aten.sigmoid.default, (a,))
    c = g.call_function(aten.tanh.default, (a,))
    d = g.call_function(aten.add.Tensor, (b, c))
    g.output(d)
    cl = cluster_graph(g, capability("aten::relu", "aten::tanh", "aten::add.Tensor"))
    clusters = [set(short(n) for n in group) for group in cl.clusters]
    for group in clusters:
        assert not ({"relu", "add"} <= group)
    assert {"relu", "tanh"} in clusters and {"add"} in clusters


def test_diamond_all_supported_is_one_cluster():
    g = Graph()
    x = g.placeholder("x")
    a = g.call_function(aten.relu.default, (x,))
    b = g.call_function(aten.sigmoid.default, (a,))
    c = g.call_function(aten.tanh.default, (a,))
    g.output(g.call_function(aten.add.Tensor, (b, c)))
    cl = cluster_graph(g, capability("aten::relu", "aten::sigmoid", "aten::tanh", "aten::add.Tensor"))
    assert len(cl.clusters) == 1 and len(cl.clusters[0]) == 4


def test_min_size_drops_small_clusters_and_structural_ops_do_not_count():
    g = Graph()
    x = g.placeholder("x")
    r = g.call_function(aten.reshape.default, (x, [4]))
    s = g.call_function(aten.sigmoid.default, (r,))
    t = g.call_function(aten.relu.default, (s,))
    u = g.call_function(aten.tanh.default, (t,))
    g.output(u)
    cl = cluster_graph(g, capability("aten::reshape", "aten::relu", "aten::tanh"), min_size=2)
    assert names(cl) == [["relu", "tanh"]] and names(cl)[0] and [short(n) for n in cl.dropped[0]] == ["reshape"]


def test_allow_and_deny_lists(monkeypatch):
    g = chain_graph([aten.relu.default, aten.sigmoid.default])
    cap = capability("aten::relu", "aten::sigmoid")
    monkeypatch.setenv("QLOWER_OP_DENYLIST", "aten::sigmoid; aten::gelu")
    cl = cluster_graph(g, cap)
    assert names(cl) == [["relu"]] and "QLOWER_OP_DENYLIST" in cl.unsupported["sigmoid_default"]
    monkeypatch.delenv("QLOWER_OP_DENYLIST")
    cap.register("aten::sigmoid", lambda n: "refused by predicate")
    assert cap.why_not(next(n for n in g.nodes if short(n) == "sigmoid")) == "aten::sigmoid: refused by predicate"
    monkeypatch.setenv("QLOWER_OP_ALLOWLIST", "aten::sigmoid")
    assert cap.supports(next(n for n in g.nodes if short(n) == "sigmoid"))


# ------------------------------------------------------------ in-place writes through a view
class _RenormedEmbedding(torch.nn.Module):
    """nn.Embedding(max_norm=) exports as embedding_renorm_(detach(weight), ...) followed by an
    embedding that reads the weight: ordered only through the aliasing, not by a data edge."""
    def __init__(self):
        super().__init__()
        self.e = torch.nn.Embedding(10, 4, max_norm=1.0)

    def forward(self, i):
        return self.e(i) * 2


def test_reader_after_a_write_through_a_view_sees_the_written_values():
    import qlower
    torch.manual_seed(0)
    model, i = _RenormedEmbedding(), torch.tensor([[1, 2, 3]])
    twin = _RenormedEmbedding()
    twin.load_state_dict(model.state_dict())
    want = twin(i)
    cm = qlower.compile(model, (i,), backend="onnxruntime")
    assert torch.equal(cm(i), want)
    reasons = [c.reason for c in cm.report().fallbacks]
    assert any("a view of" in r and "embedding_renorm_ writes into" in r for r in reasons), reasons


def test_mutation_hazards_order_readers_and_pin_written_views():
    from qlower.fx import mutation_hazards
    gm = torch.export.export(_RenormedEmbedding(), (torch.tensor([[1, 2]]),)).module()
    nodes = {n.name: n for n in gm.graph.nodes}
    hazards = mutation_hazards(gm.graph)
    assert [n.name for n in hazards.after[nodes["embedding"]]] == ["embedding_renorm_"]
    assert list(hazards.pinned) == [nodes["detach"]]


def test_mutation_hazards_near_miss_views_without_writes():
    from qlower.fx import mutation_hazards

    class Views(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return x @ self.w.detach().t() + self.w[0]
    gm = torch.export.export(Views(), (torch.randn(2, 4),)).module()
    hazards = mutation_hazards(gm.graph)
    assert not hazards.after and not hazards.pinned
