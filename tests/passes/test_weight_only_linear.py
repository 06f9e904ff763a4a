"""WeightOnlyLinear: linears with constant fp32 weights become qlower.linear_weight_only with
round-to-nearest codes (bit-identical to aten.linear on the dequantized weight); near misses
(a computed weight, a weight an embedding also reads, a kept-float module) stay; idempotent;
given codes are used as they are."""
import torch

from qlower import numerics
from qlower.passes import PassContext, PassManager
from qlower.passes.weight_only_linear import WeightOnlyLinear, round_to_nearest

LINEAR = torch.ops.aten.linear.default
WO = torch.ops.qlower.linear_weight_only.default


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 32)
        self.keep = torch.nn.Linear(32, 32)
        self.scale = torch.nn.Parameter(torch.randn(16, 32))
        self.embed = torch.nn.Embedding(16, 32)
        self.head = torch.nn.Linear(32, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x, ids):
        h = self.keep(self.a(x)) + self.embed(ids)
        computed = torch.nn.functional.linear(h, self.scale * 2)     # a weight computed in the graph
        return self.head(h) + computed


def _count(gm, target) -> int:
    return sum(n.target is target for n in gm.graph.nodes)


def _graph():
    torch.manual_seed(0)
    x, ids = torch.randn(2, 3, 64), torch.randint(0, 16, (2, 3))
    return torch.export.export(Net().eval(), (x, ids)).module(), (x, ids)


def test_positive_near_misses_idempotent_numerics():
    gm, inputs = _graph()
    want_eager = gm(*inputs)
    manager = PassManager([WeightOnlyLinear(bits=4, group_size=32, keep_float=("keep",))])
    ctx = manager.run(gm, PassContext())
    assert ctx.rewrites["linear -> 4-bit weight-only linear"] == 1            # only `a`
    assert _count(gm, WO) == 1 and _count(gm, LINEAR) == 3                      # keep, computed, tied head
    node = next(n for n in gm.graph.nodes if n.target is WO)
    assert node.args[5:] == (4, 32)
    codes, scale, zp = (getattr(gm.a, f"weight_wo_{s}") for s in ("codes", "scale", "zero_point"))
    assert codes.dtype == torch.uint8 and scale.shape == (32, 2) and zp.dtype == torch.uint8
    # numerics: the rewritten graph equals the float graph with `a`'s weight dequantized, bit for bit
    ref, _ = _graph()
    w = ref.a.weight.detach()
    s, z = numerics.weight_only_qparams(w, 4, 32, False)
    ref.a.weight = torch.nn.Parameter(numerics.dequantize_weight_groups(
        numerics.quantize_weight_groups(w, s, z, 4, 32), s, z, 32))
    assert torch.equal(gm(*inputs), ref(*inputs))
    assert not torch.equal(gm(*inputs), want_eager)
    # idempotent: a second run finds nothing
    again = PassManager([WeightOnlyLinear(bits=4, group_size=32, keep_float=("keep",))]).run(gm, PassContext())
    assert not [k for k in again.rewrites if "->" in k]
    assert ctx.rewrites["embedding tables (and a tied lm_head) kept float; WeightOnly(embeddings=True) "
                        "quantizes them"] == 1


def test_embeddings_and_given_codes():
    """embeddings=True: the embedding and the tied head read one quantized table; codes given
    for a weight are used instead of round to nearest."""
    gm, inputs = _graph()
    w = gm.a.weight.detach()
    codes, scale, zp = round_to_nearest(w, 8, 64, True)
    given = (torch.full_like(codes, 128), scale, zp)                            # all-zero weights
    ctx = PassManager([WeightOnlyLinear(bits=8, group_size=None, symmetric=True, embeddings=True,
                                        codes={"a.weight": given})]).run(gm, PassContext())
    assert ctx.rewrites["embedding -> 8-bit weight-only embedding"] == 1
    assert ctx.rewrites["linear -> 8-bit weight-only linear"] == 3              # a, keep, head
    assert torch.equal(gm.a.weight_wo_codes, given[0])
    assert not any(n.op == "get_attr" and n.target in ("embed.weight", "head.weight") for n in gm.graph.nodes)
    names = {n for n, _ in gm.named_parameters(remove_duplicate=False)}
    assert not names & {"embed.weight", "head.weight", "a.weight"} and "keep.weight" not in names
    assert bool(torch.isfinite(gm(*inputs)).all())
