"""RnnSeqFirst: batch-first recurrent layers (aten.lstm / gru and the block ops) become
sequence-first ones between two permutes, bit-identical and idempotent; sequence-first layers are
left (near misses); in the pipeline the input transposes then run on uint8 values."""
import copy

import pytest
import torch

import qlower
from qlower.passes import PassContext, PassManager, default_pipeline

from qdq_models import graph_module

ops = torch.ops.qlower


class TwoRnns(torch.nn.Module):
    def __init__(self, batch_first=True):
        super().__init__()
        self.lstm = torch.nn.LSTM(6, 8, num_layers=2, batch_first=batch_first)
        self.gru = torch.nn.GRU(8, 5, batch_first=batch_first)

    def forward(self, x):
        y, (h, c) = self.lstm(x)
        z, g = self.gru(torch.relu(y))
        return z, h, c, g


def _rnn_batch_first_flags(gm):
    rnns = (torch.ops.aten.lstm.input, torch.ops.aten.gru.input, ops.lstm.default, ops.gru.default)
    return [n.args[-1] for n in gm.graph.nodes if n.target in rnns]


@pytest.mark.parametrize("model, x", [
    (TwoRnns(), torch.randn(3, 7, 6)),
    (qlower.blockops.StatefulLSTM(6, 8, num_layers=2, batch=3), torch.randn(3, 7, 6)),
    (qlower.blockops.StatefulGRU(6, 8, batch=3), torch.randn(3, 7, 6)),
])
def test_rnn_seq_first_positive_bit_identical_and_idempotent(model, x):
    from qlower.passes import RnnSeqFirst
    torch.manual_seed(0)
    model = model.eval()
    gm = graph_module(model, x)
    want = copy.deepcopy(gm)(x)  # a copy: the stateful ones advance their state buffers per call
    ctx = PassContext()
    assert RnnSeqFirst().run(gm, ctx) and set(_rnn_batch_first_flags(gm)) == {False}
    gm.recompile()
    got = gm(x)
    for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        assert torch.equal(a, b)
    assert ctx.rewrites["recurrent layer made sequence-first"] == len(_rnn_batch_first_flags(gm))
    assert not RnnSeqFirst().run(gm, PassContext())  # idempotent


@pytest.mark.parametrize("model, x", [(TwoRnns(batch_first=False), torch.randn(7, 3, 6)),
                                      (qlower.blockops.StatefulGRU(6, 8, batch=3, batch_first=False),
                                       torch.randn(7, 3, 6))])
def test_rnn_seq_first_near_misses(model, x):
    """Already sequence-first: nothing to do."""
    from qlower.passes import RnnSeqFirst
    gm = graph_module(model.eval(), x)
    before = _rnn_batch_first_flags(gm)
    assert not RnnSeqFirst().run(gm, PassContext()) and _rnn_batch_first_flags(gm) == before


def test_rnn_seq_first_lets_the_input_transposes_merge_on_uint8():
    """conv -> transpose(1, 2) -> batch-first LSTM: after the pass the dequantize sits below
    both transposes, so the whole layout change happens on uint8 values."""
    from qlower import zoo
    entry = zoo.get("lstm")
    ep = qlower.quantize(entry.model(), entry.inputs(1), entry.calibration(2))
    gm = ep.module()
    PassManager(default_pipeline()).run(gm)
    [rnn] = [n for n in gm.graph.nodes if n.target == torch.ops.aten.lstm.input]
    dq = rnn.args[0]
    assert dq.target == ops.dequantize.default and dq.args[0].target == torch.ops.aten.permute.default
    assert dq.args[0].meta["val"].dtype == torch.uint8
