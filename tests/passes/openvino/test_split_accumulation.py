"""SplitAccumulation (openvino legalization): an integer linear whose int32 accumulator may
exceed 2^24 is split over its input features into bounded linears whose accumulators are added
(positive, the accumulator bit-identical, idempotent); a linear within the bound is left (near
miss). Pure graph work: no OpenVINO needed."""
import torch

from qlower.passes import PassContext
from qlower.passes.openvino.split_accumulation import SplitAccumulation
from qdq_models import IntegerLinear as Linear

U8, S8 = torch.uint8, torch.int8


def test_split_accumulation_fires_only_beyond_the_bound():
    """The pass: split points keep every channel's partial sum (bias in the first) below 2^24;
    near misses: within the bound, or one column alone at it (no split helps)."""
    from qlower.passes.openvino.split_accumulation import split_points
    columns = torch.full((2, 3072), 255 * 128, dtype=torch.int64)
    cuts = split_points(columns, torch.tensor([5000, 0]))
    assert cuts[0] == 0 and cuts[-1] == 3072 and len(cuts) == 7
    for k0, k1 in zip(cuts, cuts[1:]):
        first = torch.tensor([5000, 0]) if k0 == 0 else 0
        assert int((columns[:, k0:k1].sum(1) + first).max()) < 2**24
    assert split_points(columns[:, :500], torch.zeros(2, dtype=torch.int64)) is None
    assert split_points(torch.full((1, 4), 2**24, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)) is None
    # on a graph: fires once, the accumulator unchanged, idempotent
    from qlower.passes.openvino.split_accumulation import SplitAccumulation
    from qlower.passes import PassContext, PassManager
    x = torch.full((2, 3072), 255, dtype=U8)
    model = Linear(torch.full((4, 3072), -128, dtype=S8), torch.arange(4, dtype=torch.int32), 0)
    gm = torch.export.export(model, (x,)).module()
    want = gm(x)
    ctx = PassManager([SplitAccumulation()]).run(gm, PassContext())
    assert sum(ctx.rewrites.values()) == 1
    assert [n.target for n in gm.graph.nodes].count(torch.ops.qlower.linear.default) == 6   # 514 columns each
    assert torch.equal(gm(x), want)
    assert not PassManager([SplitAccumulation()]).run(gm, PassContext()).rewrites


def test_split_accumulation_leaves_a_linear_within_the_bound():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (2, 768), generator=g).to(U8)
    model = Linear(torch.randint(-128, 128, (4, 768), generator=g).to(S8), torch.arange(4, dtype=torch.int32), 3)
    gm = torch.export.export(model, (x,)).module()
    before, want = str(gm.graph), gm(x)
    assert not SplitAccumulation().run(gm, PassContext())
    assert str(gm.graph) == before and torch.equal(gm(x), want)
