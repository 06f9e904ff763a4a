"""DropEvalDropout: eval-mode dropouts (identities) are removed, values unchanged, idempotent; a
dropout with training=True stays (near miss); under `int8` the residual add after a dropout is
quantized like one after a bare linear."""
import pytest
import torch

import qlower
from qlower.passes import PassContext, PassManager
from qlower.passes.drop_eval_dropout import DROPOUTS


class ResidualWithDropout(torch.nn.Module):
    """A transformers block in small: linear -> dropout(training=self.training) -> residual add
    (and a channel dropout, nn.Dropout1d's aten.feature_dropout)."""

    def __init__(self, train_dropout: bool | None = None):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.train_dropout = train_dropout

    def forward(self, x):
        train = self.training if self.train_dropout is None else self.train_dropout
        h = torch.nn.functional.dropout(self.fc(x), 0.1, training=train)
        return torch.nn.functional.dropout1d(h[:, :, None], 0.2, training=train)[:, :, 0] + x


def _dropouts(gm) -> int:
    return sum(n.target in DROPOUTS for n in gm.graph.nodes)


def test_drop_eval_dropout():
    """Positive: eval-mode dropout and feature dropout are removed, values unchanged; idempotent.
    Near miss: a dropout the model asks for with training=True is random and stays."""
    from qlower.passes import DropEvalDropout
    x = torch.randn(4, 8)
    gm = torch.export.export(ResidualWithDropout().eval(), (x,)).module()
    assert _dropouts(gm) == 2                       # torch 2.13 (pinned) keeps them
    want = gm(x)
    assert PassManager([DropEvalDropout()]).run(gm, PassContext()).rewrites["eval-mode dropout dropped (identity)"] == 2
    assert _dropouts(gm) == 0 and torch.equal(gm(x), want)
    assert not PassManager([DropEvalDropout()]).run(gm, PassContext()).rewrites     # idempotent
    random = torch.export.export(ResidualWithDropout(train_dropout=True).eval(), (x,)).module()
    assert _dropouts(random) == 2
    assert not PassManager([DropEvalDropout()]).run(random, PassContext()).rewrites
    assert _dropouts(random) == 2


class AttentionThenResidualWithDropout(ResidualWithDropout):
    def forward(self, x):
        a = torch.nn.functional.scaled_dot_product_attention(x[None], x[None], x[None])[0]
        return torch.nn.functional.dropout(self.fc(a), 0.1, training=self.training) + x


@pytest.mark.parametrize("model, quantize_attention", [(ResidualWithDropout, False),
                                                       (AttentionThenResidualWithDropout, True)])
def test_eval_dropout_does_not_keep_the_residual_add_float(model, quantize_attention):
    """Under `int8` the residual add after linear -> dropout is quantized like one after a bare
    linear (a dropout hides the linear's quantized output from the annotation: HF BERT/GPT-2/ViT
    would keep every residual add and LayerNorm float, and IREE could not match the reference bit
    for bit). With quantize_attention, torch's re-trace has already turned the dropouts into clones,
    which the annotation looks through like any shape-only op."""
    from qlower.quantize import QuantConfig
    x = torch.randn(4, 8)
    program = qlower.quantize(model(), (x,), [(torch.randn(4, 8),) for _ in range(4)],
                              QuantConfig(quantize_attention=quantize_attention))
    adds = [n for n in program.graph.nodes if n.target is torch.ops.aten.add.Tensor]
    assert len(adds) == 1 and all("quantize" in str(a.target) for a in adds[0].args), adds[0].args
    assert not any(n.target in DROPOUTS for n in program.graph.nodes)
    assert [u.target for u in adds[0].users] == [torch.ops.quantized_decomposed.quantize_per_tensor.default]
