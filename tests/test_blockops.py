"""Block ops: reference vs PyTorch, decomposition, export survival, boundary quantization,
onnxruntime agreement, state across calls, replace()."""
import copy

import pytest
import torch
from torch import nn
import torch.nn.functional as F

import qlower
from qlower import blockops as bo
from qlower.blockops import ops as bops

from conftest import calib
from qdq_models import OpCall as _OpCall

qops = torch.ops.qlower


def one_node(model, inputs, target, dynamic_shapes=None):
    ep = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    return [n for n in ep.graph.nodes if n.op == "call_function" and n.target == target], ep


# ---------------------------------------------------------------- per-op: reference / decomposition
CASES = {
    "rms_norm": (lambda x: bops.rms_norm(x, [16], torch.rand(16) + 0.5, 1e-6), (2, 5, 16)),
    "layer_norm": (lambda x: bops.layer_norm(x, [16], torch.rand(16), torch.rand(16), 1e-5), (2, 5, 16)),
    "skip_layer_norm": (lambda x: bops.skip_layer_norm(x, x.flip(0), [16], None, None, 1e-5), (2, 5, 16)),
    "group_norm": (lambda x: bops.group_norm(x, 4, torch.rand(8), torch.rand(8), 1e-5, True), (2, 8, 4, 4)),
    "attention_gqa_causal": (lambda x: bops.attention(x, x[:, :2], x[:, 2:], None, True, None), (2, 4, 6, 8)),
    "attention_mask": (lambda x: bops.attention(x, x, x, torch.randn(6, 6), False, 0.3), (2, 4, 6, 8)),
}
# masked_softmax and rotary_embedding have no separate PyTorch functional: their reference kernel
# is the decomposition, so they are checked against independent formulations below instead.


@pytest.mark.parametrize("case", sorted(CASES))
def test_decomposition_matches_reference(case):
    torch.manual_seed(0)
    fn, shape = CASES[case]
    x = torch.randn(*shape)
    torch.manual_seed(1)
    ref = fn(x)
    # Re-run with the decomposition in place of every block op called by fn.
    with _decomposed():
        torch.manual_seed(1)
        dec = fn(x)
    assert torch.allclose(ref, dec, atol=1e-5, rtol=1e-5)


class _decomposed:
    """Swap the block ops' kernels for their decompositions (test helper)."""

    def __enter__(self):
        self.saved = {}
        for name in ("rms_norm", "layer_norm", "skip_layer_norm", "group_norm", "attention"):
            op = getattr(bops, name)
            self.saved[name] = op
            setattr(bops, name, bops.DECOMPOSITIONS[op._opoverload])
        return self

    def __exit__(self, *exc):
        for name, op in self.saved.items():
            setattr(bops, name, op)


def test_masked_softmax_matches_independent_formulas():
    torch.manual_seed(0)
    scores = torch.randn(2, 5, 16)
    mask = torch.zeros(5, 16).masked_fill(torch.rand(5, 16) > 0.7, -1e4)
    assert torch.allclose(bops.masked_softmax(scores, mask, None, -1), torch.softmax(scores + mask, -1), atol=1e-6)
    lengths = torch.tensor([3, 0]).reshape(2, 1)  # row 1: every position masked
    got = bops.masked_softmax(scores, None, lengths, -1)
    assert torch.allclose(got[0, :, :3], torch.softmax(scores[0, :, :3], -1), atol=1e-6)
    assert not got[0, :, 3:].any() and not got[1].any() and not got.isnan().any()


def test_rotary_matches_complex_rotation():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 6, 8)
    angles = torch.rand(6, 4) * 6.0
    turn = torch.polar(torch.ones_like(angles), angles)
    # interleaved (GPT-J): pairs (2k, 2k+1) are complex numbers rotated by angle k
    got = bops.rotary_embedding(x, angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1), True)
    want = torch.view_as_real(torch.view_as_complex(x.reshape(2, 4, 6, 4, 2)) * turn).flatten(-2)
    assert torch.allclose(got, want, atol=1e-5)
    # half split (GPT-NeoX / LLaMA): pairs (k, k + 4)
    got = bops.rotary_embedding(x, torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1), False)
    z = torch.complex(x[..., :4], x[..., 4:]) * turn
    assert torch.allclose(got, torch.cat([z.real, z.imag], -1), atol=1e-5)


def test_modules_match_pytorch_modules_exactly():
    torch.manual_seed(0)
    x = torch.randn(3, 7, 16)
    pairs = [(nn.LayerNorm(16), bo.LayerNorm(16)), (nn.RMSNorm(16), bo.RMSNorm(16))]
    for ref, blk in pairs:
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5)
        blk.load_state_dict(ref.state_dict())
        assert torch.equal(blk(x), ref(x))
    g_ref, g_blk = nn.GroupNorm(4, 8), bo.GroupNorm(4, 8, silu=True)
    g_blk.load_state_dict(g_ref.state_dict())
    img = torch.randn(2, 8, 5, 5)
    assert torch.equal(g_blk(img), F.silu(g_ref(img)))
    q = torch.randn(2, 4, 6, 8)
    assert torch.equal(bo.Attention(causal=True)(q, q, q), F.scaled_dot_product_attention(q, q, q, is_causal=True))


@pytest.mark.parametrize("module,inputs,target", [
    (bo.RMSNorm(16), (torch.randn(2, 5, 16),), qops.rms_norm.default),
    (bo.LayerNorm(16), (torch.randn(2, 5, 16),), qops.layer_norm.default),
    (bo.GroupNorm(2, 8, silu=True), (torch.randn(2, 8, 3, 3),), qops.group_norm.default),
    (bo.Attention(causal=True), (torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)),
     qops.attention.default),
    (bo.MaskedSoftmax(), (torch.randn(2, 5, 16), torch.zeros(5, 16)), qops.masked_softmax.default),
])
def test_export_survival_one_node_with_dynamic_seq(module, inputs, target):
    nodes, ep = one_node(module, inputs, target)
    assert len(nodes) == 1
    if inputs[0].dim() == 3 and target is not qops.masked_softmax.default:
        seq = torch.export.Dim("seq", min=2, max=64)
        nodes, ep = one_node(module, inputs, target, dynamic_shapes=({1: seq},))
        assert len(nodes) == 1
        longer = torch.randn(2, 9, 16)
        assert torch.equal(ep.module()(longer), module(longer))


# ---------------------------------------------------------------- pipeline
class NormAttnBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 48)
        self.norm = bo.LayerNorm(16)
        self.rms = bo.RMSNorm(16)
        self.attn = bo.Attention()
        self.out = nn.Linear(16, 16)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.inp(self.norm(x)).reshape(b, s, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
        y = self.attn(q, k, v).transpose(1, 2).reshape(b, s, 16)
        return self.out(self.rms(y)) + x


def test_block_ops_quantized_at_boundary_only():
    torch.manual_seed(0)
    m = NormAttnBlock().eval()
    ep = qlower.quantize(m, (torch.randn(1, 6, 16),), calib((1, 6, 16)))
    from qlower.fx import is_dequantize, is_quantize
    for node in ep.graph.nodes:
        if node.target in (qops.layer_norm.default, qops.rms_norm.default, qops.attention.default):
            acts = node.args[:3] if node.target is qops.attention.default else node.args[:1]
            assert all(is_dequantize(a) for a in acts), node
            assert all(is_quantize(u) for u in node.users), node
    assert sum(n.target in (qops.layer_norm.default, qops.rms_norm.default, qops.attention.default)
               for n in ep.graph.nodes) == 3  # still single nodes, nothing decomposed inside


def test_block_ops_reference_vs_onnxruntime():
    torch.manual_seed(0)
    m = NormAttnBlock().eval()
    x = (torch.randn(1, 6, 16),)
    ep = qlower.quantize(m, x, calib((1, 6, 16)))
    ref = qlower.compile(ep, x, backend="reference")
    ort = qlower.compile(ep, x, backend="onnxruntime")
    assert not ort.report().fallbacks, str(ort.report())
    ops_in_clusters = set().union(*[c.ops for c in ort.report().compiled])
    assert {"qlower::layer_norm", "qlower::rms_norm", "qlower::attention"} <= ops_in_clusters
    for seed in range(3):
        xs = calib((1, 6, 16), n=1, seed=40 + seed)[0]
        assert (ort(*xs) - ref(*xs)).abs().max() < 1e-4  # float internals: ORT vs PyTorch kernels


# ---------------------------------------------------------------- state
def test_kv_cache_and_streaming_buffer_across_calls_with_reset():
    cache = bo.KVCache(1, 2, 6, 4)
    k1, v1 = torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4)
    k, v = cache(k1, v1, torch.tensor(0))
    k2 = torch.randn(1, 2, 1, 4)
    k, _ = cache(k2, k2, torch.tensor(2))
    assert torch.equal(k[:, :, :2], k1) and torch.equal(k[:, :, 2:3], k2) and not k[:, :, 3:].any()
    buf = bo.StreamingBuffer(window=4, channels=3)
    frames = [torch.full((1, 2, 3), float(i + 1)) for i in range(3)]
    outs = [buf(frames[0]), buf(frames[1]), buf(frames[2], reset=True)]
    assert outs[1][0, :, 0].tolist() == [1, 1, 2, 2] and outs[2][0, :, 0].tolist() == [0, 0, 3, 3]


class StreamingKWS(nn.Module):
    def __init__(self):
        super().__init__()
        self.front = nn.Linear(10, 16)
        self.lstm = bo.StatefulLSTM(16, 16)
        self.gru = bo.StatefulGRU(16, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x, reset):
        y = self.gru(self.lstm(torch.relu(self.front(x)), reset), reset)
        return self.head(y[:, -1])


@pytest.mark.parametrize("backend", ["onnxruntime", "iree", "openvino"])
def test_stateful_rnn_through_compiled_module_matches_eager_with_reset(backend, tmp_path):
    torch.manual_seed(0)
    eager = StreamingKWS().eval()
    compiled_src = copy.deepcopy(eager)
    chunk = lambda i: torch.randn(1, 5, 10, generator=torch.Generator().manual_seed(i))
    cm = qlower.compile(compiled_src, (chunk(0), torch.tensor(False)), backend=backend)
    resets = [False, False, True, False, False]
    for i, r in enumerate(resets):
        want = eager(chunk(i), torch.tensor(r))
        got = cm(chunk(i), torch.tensor(r))
        assert torch.allclose(got, want, atol=1e-5), i
    # save/load keeps the state semantics: the loaded module continues from the saved state
    path = cm.save(tmp_path / "kws.pt2")
    loaded = qlower.load(path)
    want = eager(chunk(9), torch.tensor(False))
    assert torch.allclose(loaded(chunk(9), torch.tensor(False)), want, atol=1e-5)


@pytest.mark.parametrize("backend", ["onnxruntime", "iree", "openvino"])
def test_block_decoder_generates_tokens_through_compiled_module(backend):
    from qlower.zoo.block_lm import BlockDecoderLM
    torch.manual_seed(0)
    eager = BlockDecoderLM().eval()
    compiled_src = copy.deepcopy(eager)
    cm = qlower.compile(compiled_src, (torch.tensor([[1]]), torch.tensor(0)), backend=backend)
    targets = {n.target for n in cm.graph_module.graph.nodes if n.op == "call_function"}
    assert {qops.rms_norm.default, qops.attention.default, qops.rotary_embedding.default,
            qops.kv_cache_update.default} <= targets
    token_e = token_c = torch.tensor([[3]])
    generated_e, generated_c = [], []
    for step in range(8):
        pos = torch.tensor(step)
        logits_e, logits_c = eager(token_e, pos), cm(token_c, pos)
        assert torch.allclose(logits_c, logits_e, atol=1e-4), step
        token_e, token_c = logits_e.argmax(-1), logits_c.argmax(-1)
        generated_e.append(int(token_e))
        generated_c.append(int(token_c))
    assert generated_c == generated_e


# ---------------------------------------------------------------- replace()
class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.rms = nn.RMSNorm(16)
        self.gn = nn.GroupNorm(4, 16)
        self.lstm = nn.LSTM(16, 16, batch_first=True)
        self.gru = nn.GRU(16, 16, batch_first=True)
        self.mha = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        x = self.rms(self.ln(x))
        x = self.gn(x.transpose(1, 2)).transpose(1, 2)
        x, _ = self.lstm(x)
        x, _ = self.gru(x)
        y, _ = self.mha(x, x, x, need_weights=False)
        q = y.reshape(y.shape[0], y.shape[1], 2, 8).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)


def test_replace_swaps_each_module_and_keeps_outputs():
    torch.manual_seed(0)
    model = Mixed().eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        want = model(x)
    report = bo.replace(model)
    assert len(report.modules) == 6 and report.sdpa_routed
    with torch.no_grad():
        got = model(x)
    assert torch.allclose(got, want, atol=1e-6)  # MHA's fused fast path may differ in the last bit
    ep = torch.export.export(model, (x,))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    for op in (qops.layer_norm.default, qops.rms_norm.default, qops.group_norm.default, qops.lstm.default,
               qops.gru.default):
        assert targets.count(op) == 1, op
    assert targets.count(qops.attention.default) == 2  # the MHA core and the routed SDPA call


# ---------------------------------------------------------------- ONNX: one node per block op
def _rnn_case(kind, layers, batch_first):
    rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(6, 5, num_layers=layers, batch_first=batch_first)
    weights = {f"w{i}": w.detach().clone() for i, w in enumerate(rnn._flat_weights)}
    h0 = torch.randn(layers, 2, 5)

    def call(m, x, h, reset):
        ws = [getattr(m, f"w{i}") for i in range(len(weights))]
        if kind == "lstm":
            return bops.lstm(x, h, h * 0.5, reset, ws, layers, batch_first)
        return bops.gru(x, h, reset, ws, layers, batch_first)
    x = torch.randn(2, 4, 6) if batch_first else torch.randn(4, 2, 6)
    return _OpCall(call, **weights), (x, h0, torch.tensor(False)), (x, h0, torch.tensor(True))


ONNX_CASES = {
    # name: (module, inputs, expected ONNX (domain, op_type) of the block op)
    "rms_norm": (_OpCall(lambda m, x: bops.rms_norm(x, [8], m.w, 1e-6), w=torch.rand(8) + 0.5),
                 (torch.randn(2, 3, 8),), ("", "RMSNormalization")),
    "layer_norm": (_OpCall(lambda m, x: bops.layer_norm(x, [8], m.w, None, 1e-5), w=torch.rand(8)),
                   (torch.randn(2, 3, 8),), ("", "LayerNormalization")),
    "group_norm": (_OpCall(lambda m, x: bops.group_norm(x, 2, None, None, 1e-5, False)),
                   (torch.randn(2, 4, 3, 3),), ("qlower", "group_norm")),
    "group_norm_silu": (_OpCall(lambda m, x: bops.group_norm(x, 2, m.w, m.b, 1e-5, True), w=torch.rand(4),
                                b=torch.rand(4)), (torch.randn(2, 4, 3, 3),), ("qlower", "group_norm_silu")),
    "skip_layer_norm": (_OpCall(lambda m, x, s: bops.skip_layer_norm(x, s, [8], None, None, 1e-5)),
                        (torch.randn(2, 3, 8), torch.randn(2, 3, 8)), ("qlower", "skip_layer_norm")),
    "attention_gqa_causal": (_OpCall(lambda m, q, k, v: bops.attention(q, k, v, None, True, None)),
                             (torch.randn(1, 4, 5, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)),
                             ("", "Attention")),
    "attention_bool_mask": (_OpCall(lambda m, q, mask: bops.attention(q, q, q, mask, False, 0.3)),
                            (torch.randn(2, 2, 5, 8), torch.rand(2, 1, 1, 5) > 0.3), ("", "Attention")),
    "masked_softmax_mask": (_OpCall(lambda m, s, mask: bops.masked_softmax(s, mask, None, -1)),
                            (torch.randn(2, 5, 6), torch.randn(5, 6)), ("qlower", "masked_softmax")),
    "masked_softmax_lengths": (_OpCall(lambda m, s, n: bops.masked_softmax(s, None, n, -1)),
                               (torch.randn(3, 2, 4, 6), torch.tensor([6, 2, 0])),
                               ("qlower", "masked_softmax_lengths")),
    "rotary_half": (_OpCall(lambda m, x: bops.rotary_embedding(x, m.c, m.s, False), c=torch.rand(5, 8),
                            s=torch.rand(5, 8)), (torch.randn(1, 2, 5, 8),), ("qlower", "rotary_embedding")),
    "rotary_interleaved": (_OpCall(lambda m, x: bops.rotary_embedding(x, m.c, m.s, True), c=torch.rand(5, 8),
                                   s=torch.rand(5, 8)), (torch.randn(1, 2, 5, 8),),
                           ("qlower", "rotary_embedding_interleaved")),
    "kv_cache_update": (_OpCall(lambda m, c, n, p: bops.kv_cache_update(c, n, p)),
                        (torch.randn(1, 2, 6, 4), torch.randn(1, 2, 2, 4), torch.tensor(3)),
                        ("qlower", "kv_cache_update")),
    "stream_buffer": (_OpCall(lambda m, s, f, r: bops.stream_buffer(s, f, r)),
                      (torch.randn(1, 5, 3), torch.randn(1, 2, 3), torch.tensor(True)), ("qlower", "stream_buffer")),
}


@pytest.mark.parametrize("case", sorted(ONNX_CASES))
def test_block_op_is_one_onnx_node_and_matches_reference(case, tmp_path):
    """ONNX Runtime runs the op in one cluster (no fallback), agrees with the reference kernel,
    and the file exported in ONNX Runtime's form (onnx_ops="onnxruntime") holds the op as a single
    node that onnx's own reference evaluator (a second runtime) executes through the function body."""
    import onnx
    import onnx.inliner
    from onnx.reference import ReferenceEvaluator
    torch.manual_seed(0)
    module, inputs, (domain, op_type) = ONNX_CASES[case]
    cm = qlower.compile(module, inputs, backend="onnxruntime")
    assert not cm.report().fallbacks, str(cm.report())
    want = module(*inputs)
    assert torch.allclose(cm(*inputs), want, atol=1e-5), case
    model = onnx.load(qlower.export(cm, tmp_path / "m.onnx", format="onnx", onnx_ops="onnxruntime"))
    kinds = [(n.domain, n.op_type) for n in model.graph.node]
    assert kinds.count((domain, op_type)) == 1, kinds
    if domain == "qlower":
        assert any(f.name == op_type and f.domain == "qlower" for f in model.functions)
    # Inlined as ONNX Runtime does at load; the evaluator needs shapes for context-dependent ops.
    inlined = onnx.shape_inference.infer_shapes(onnx.inliner.inline_local_functions(model))
    got = ReferenceEvaluator(inlined).run(None, {i.name: x.numpy() for i, x in zip(model.graph.input, inputs)})[0]
    assert torch.allclose(torch.from_numpy(got), want, atol=1e-5), case


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("layers,batch_first", [(1, True), (2, False)])
def test_rnn_maps_to_onnx_with_reordered_gates_and_reset(kind, layers, batch_first):
    torch.manual_seed(0)
    module, inputs, reset_inputs = _rnn_case(kind, layers, batch_first)
    cm = qlower.compile(module, inputs, backend="onnxruntime")
    assert not cm.report().fallbacks, str(cm.report())
    import onnx
    onnx_ops = {n.op_type for c in cm.report().compiled for n in onnx.load_from_string(c.onnx).graph.node}
    assert kind.upper() in onnx_ops
    for args in (inputs, reset_inputs):
        for got, want in zip(cm(*args), module(*args)):
            assert torch.allclose(got, want, atol=1e-5), (kind, layers, batch_first)


def test_attention_decomposition_is_top_left_causal_like_sdpa():
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8)
    want = F.scaled_dot_product_attention(q, k, k, is_causal=True)
    assert torch.allclose(bops.attention_decomposed(q, k, k, None, True, None), want, atol=1e-6)


# ---------------------------------------------------------------- DecomposeBlockOps
def test_backend_decomposes_denied_block_op_and_reports_it(monkeypatch):
    monkeypatch.setenv("QLOWER_OP_DENYLIST", "qlower::rotary_embedding")
    module, inputs, _ = ONNX_CASES["rotary_interleaved"]
    cm = qlower.compile(module, inputs, backend="onnxruntime")
    report = cm.report()
    assert not report.fallbacks and any("decomposed qlower::rotary_embedding" in n for n in report.notes)
    assert "qlower::rotary_embedding" not in set().union(*[c.ops for c in report.compiled])
    assert torch.allclose(cm(*inputs), module(*inputs), atol=1e-6)


@pytest.mark.parametrize("case", sorted(ONNX_CASES) + ["lstm", "gru"])
def test_every_block_op_survives_export_as_one_node(case):
    if case in ("lstm", "gru"):
        module, inputs, _ = _rnn_case(case, 2, True)
    else:
        module, inputs, _ = ONNX_CASES[case]
    ep = torch.export.export(module, inputs)
    block = [n for n in ep.graph.nodes if n.op == "call_function" and n.target in bops.BLOCK_OPS]
    assert len(block) == 1, [n.target for n in ep.graph.nodes]


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_plain_pytorch_rnn_maps_to_onnx_too(cls):
    torch.manual_seed(0)
    rnn = cls(6, 5, num_layers=2, batch_first=True).eval()
    x = torch.randn(2, 4, 6)
    cm = qlower.compile(rnn, (x,), backend="onnxruntime")
    assert not cm.report().fallbacks, str(cm.report())
    for got, want in zip(torch.utils._pytree.tree_leaves(cm(x)), torch.utils._pytree.tree_leaves(rnn(x))):
        assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("case", ["rms_norm", "layer_norm", "group_norm_silu", "skip_layer_norm",
                                  "masked_softmax_mask", "rotary_half", "attention_gqa_causal"])
def test_every_stateless_block_op_is_quantized_at_its_boundary(case):
    """Activation inputs arrive through dequantize, the output leaves through quantize, and the
    op stays one node: its internals run in float (weights, masks and cos/sin tables are never
    quantized)."""
    from qlower.fx import is_dequantize, is_quantize
    from qlower.quantize.quantizer import BLOCK_OP_ACTIVATION_INPUTS
    torch.manual_seed(0)
    module, inputs, _ = ONNX_CASES[case]
    calibration = [tuple(t.normal_() if t.is_floating_point() else t for t in map(torch.clone, inputs))
                   for _ in range(3)]
    ep = qlower.quantize(module, inputs, calibration)
    ops = [n for n in ep.graph.nodes if n.op == "call_function" and n.target in bops.BLOCK_OPS]
    assert len(ops) == 1, case
    op = ops[0]
    for i in BLOCK_OP_ACTIVATION_INPUTS[op.target]:
        assert is_dequantize(op.args[i]), (case, i)
    others = [a for i, a in enumerate(op.args)
              if isinstance(a, torch.fx.Node) and i not in BLOCK_OP_ACTIVATION_INPUTS[op.target]]
    assert not any(is_dequantize(a) for a in others), case
    assert all(is_quantize(u) for u in op.users), case
