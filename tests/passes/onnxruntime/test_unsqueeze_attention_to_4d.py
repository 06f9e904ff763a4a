"""UnsqueezeAttentionTo4d (onnxruntime legalization): attention on rank-2 and rank-3 query / key /
value gets leading unit dims to rank 4 (positive, idempotence, values, one ONNX Runtime
cluster); rank-4 and rank-5 attention are left alone (near misses), rank 5 refused."""
import pytest
import torch

import qlower


class _Attention(torch.nn.Module):
    def __init__(self, causal=False):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=None if self.causal else mask,
                                                                is_causal=self.causal)


def _sdpa_ranks(gm) -> list[int]:
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    return [n.args[0].meta["val"].dim() for n in gm.graph.nodes if n.target is sdpa]


@pytest.mark.parametrize("shape, mask_shape, causal", [((2, 5, 8), (2, 5, 6), False), ((5, 8), (5, 6), False),
                                                       ((3, 5, 8), None, True)])
def test_attention_of_rank_2_and_3_is_unsqueezed_to_rank_4(shape, mask_shape, causal):
    """torchlib translates rank-4 attention only; ranks 2 and 3 fail in the exporter after the
    capability accepts them (the whole cluster would then run in PyTorch). The pass: positive case,
    a second run changes nothing, the values are identical before and after, and the model runs
    in ONNX Runtime as one cluster."""
    from qlower.passes.onnxruntime.unsqueeze_attention_to_4d import UnsqueezeAttentionTo4d
    from qlower.passes import PassContext
    q = torch.randn(*shape)
    kv = torch.randn(*shape[:-2], 6, shape[-1])
    mask = torch.randn(*mask_shape) if mask_shape else torch.zeros(())
    args = (q, kv, kv * 2, mask)
    model = _Attention(causal).eval()
    gm = torch.export.export(model, args).module()
    before = gm(*args)
    assert _sdpa_ranks(gm) == [len(shape)]
    assert UnsqueezeAttentionTo4d().run(gm, PassContext()) is True
    assert _sdpa_ranks(gm) == [4]
    assert UnsqueezeAttentionTo4d().run(gm, PassContext()) is False
    # the same math; PyTorch's CPU attention kernel differs by rank (float rounding apart)
    torch.testing.assert_close(gm(*args), before, rtol=1e-6, atol=1e-6)
    cm = qlower.compile(model, args, backend="onnxruntime")
    assert [c.status for c in cm.report().clusters] == ["compiled"]
    torch.testing.assert_close(cm(*args), model(*args))


def test_rank_4_and_rank_5_attention_are_left_alone_and_rank_5_is_refused():
    from qlower.passes.onnxruntime.unsqueeze_attention_to_4d import UnsqueezeAttentionTo4d
    from qlower.passes import PassContext
    for shape in ((2, 3, 5, 8), (2, 2, 3, 5, 8)):
        args = (torch.randn(*shape), torch.randn(*shape), torch.randn(*shape), torch.randn(5, 5))
        gm = torch.export.export(_Attention().eval(), args).module()
        assert UnsqueezeAttentionTo4d().run(gm, PassContext()) is False
    cm = qlower.compile(_Attention().eval(), args, backend="onnxruntime")
    (refused,) = cm.report().fallbacks
    assert "rank-5 query/key/value" in refused.reason
    torch.testing.assert_close(cm(*args), _Attention()(*args))
