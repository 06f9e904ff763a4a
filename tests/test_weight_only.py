"""Weight-only quantization (int4-weight / int8-weight): the numerics against hand computations
and torchao's affine primitives, the reference backend against eager dequantized math (bit for
bit), ONNX Runtime's MatMulNBits, OpenVINO's compressed weights and IREE's i4/i8 codes within
the declared reordered-sum profile, presets, the embedding option, GPTQ / AWQ against round to nearest, and
the block-op LM as one cluster."""
import onnx
import pytest
import torch

import qlower
from qlower import QuantConfig, QuantizeError, WeightOnly, numerics
from qlower.quantize.awq import clip_ratios
from qlower.quantize.awq import search as awq_search
from qlower.quantize.gptq import gptq
from qlower.zoo.block_lm import BlockDecoderLM

from conftest import HAS_IREE, HAS_OPENVINO

W = torch.tensor([[-1.0, 0.5, 2.0, 0.25, 0.75, -0.5]])


def test_group_qparams_by_hand():
    """Asymmetric 4-bit, groups of 4 (the last one holds 2 values): s = (hi - lo) / 15 with
    the range widened to hold 0, zp = RNE(-lo / s); symmetric: s = max|w| / 7, zp = 8."""
    scale, zp = numerics.weight_only_qparams(W, 4, 4, symmetric=False)
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)
    assert torch.equal(scale, torch.stack([f32(3.0) / 15, f32(1.25) / 15])[None])
    assert zp.tolist() == [[5, 6]] and zp.dtype == torch.uint8
    codes = numerics.quantize_weight_groups(W, scale, zp, 4, 4)
    # -1/0.2 = -5 -> 0; 0.5/0.2 = 2.5 -> 2 (half to even) -> 7; 2/0.2 -> 15; 0.25/0.2 = 1.25 -> 6;
    # second group s = 1.25/15, zp = 6: 0.75 -> 9 + 6 = 15, -0.5 -> -6 + 6 = 0
    assert codes.tolist() == [[0, 7, 15, 6, 15, 0]]
    want = [(c - z) * s for c, z, s in zip(codes[0].tolist(), [5] * 4 + [6] * 2,
                                           [scale[0, 0]] * 4 + [scale[0, 1]] * 2)]
    assert torch.equal(numerics.dequantize_weight_groups(codes, scale, zp, 4), torch.stack(want)[None])
    s_sym, z_sym = numerics.weight_only_qparams(W, 4, 4, symmetric=True)
    assert torch.equal(s_sym[0, 0], f32(2.0) / 7) and z_sym.tolist() == [[8, 8]]
    # fp32(2/7) rounds up, so -1 / s = -3.4999998 -> -3 -> 5 (not the tie -3.5 -> -4 of exact
    # arithmetic); 0.5 / s = 1.75 -> 2 -> 10; 2 / s = 7 -> 15
    assert numerics.quantize_weight_groups(W, s_sym, z_sym, 4, 4)[0, :3].tolist() == [5, 10, 15]
    zero_scale, _ = numerics.weight_only_qparams(torch.zeros(2, 8), 4, 8, symmetric=False)
    assert bool((zero_scale == numerics.FP32_EPS).all())   # an all-zero group: the smallest scale


def test_asymmetric_numerics_equal_torchao_affine():
    """The asymmetric scheme is torchao's choose_qparams_affine / quantize_affine /
    dequantize_affine (ASYMMETRIC, integer zero point, block (1, g)) bit for bit."""
    from torchao.quantization.quant_primitives import (MappingType, choose_qparams_affine, dequantize_affine,
                                                       quantize_affine)
    torch.manual_seed(0)
    w = torch.randn(16, 256) * torch.rand(16, 1)
    for bits, g in ((4, 32), (4, 128), (8, 64)):
        block = (1, g)
        qmax = (1 << bits) - 1
        s_ao, z_ao = choose_qparams_affine(w, MappingType.ASYMMETRIC, block, torch.uint8, 0, qmax,
                                           eps=numerics.FP32_EPS)
        s, z = numerics.weight_only_qparams(w, bits, g, symmetric=False)
        assert torch.equal(s, s_ao) and torch.equal(z.to(torch.int32), z_ao.to(torch.int32))
        codes = numerics.quantize_weight_groups(w, s, z, bits, g)
        assert torch.equal(codes, quantize_affine(w, block, s_ao, z_ao, torch.uint8, 0, qmax))
        assert torch.equal(numerics.dequantize_weight_groups(codes, s, z, g),
                           dequantize_affine(codes, block, s_ao, z_ao, torch.uint8, 0, qmax))


@pytest.mark.parametrize("bits,group,symmetric", [(4, 32, False), (4, 128, True), (8, 64, False), (4, 24, False)])
def test_fake_quantization_equals_codes_and_back(bits, group, symmetric):
    """The one-pass fake quantization an accuracy search calls is the codes' dequantization bit
    for bit (signed zeros, a last group shorter than the others, NaN and infinities included);
    clipping with the groups' max |w| handed over equals clipping that finds it."""
    torch.manual_seed(bits + group)
    w = torch.randn(24, 100) * torch.rand(24, 1) * 4
    w[0, :7] = 0.0
    w[1, 3], w[2, 5], w[3, 1] = float("nan"), float("inf"), -float("inf")
    w[4, 10] = -1e-6   # rounds to -0.0 (as do many small negative weights)
    scale, zp = numerics.weight_only_qparams(w, bits, group, symmetric)
    scale = scale.nan_to_num(1.0, 1.0, 1.0)   # the NaN / inf rows' own scales are not finite
    codes = numerics.quantize_weight_groups(w, scale, zp, bits, group)
    want = numerics.dequantize_weight_groups(codes, scale, zp, group)
    got = numerics.fake_quantize_weight_groups(w, scale, zp, bits, group)
    assert got.shape == w.shape and torch.equal(got.view(torch.int32), want.view(torch.int32))
    finite = torch.nan_to_num(w, 0.0, 0.0, 0.0)
    ratio = torch.rand(24, numerics.weight_groups(100, group)) * 0.5 + 0.5
    _, amax = numerics.weight_group_ranges(finite, group, symmetric=True)
    assert torch.equal(numerics.clip_weight_groups(finite, ratio, group, amax),
                       numerics.clip_weight_groups(finite, ratio, group))


def test_padded_codes_dequantize_to_zero_past_k():
    """The engines' whole groups or blocks: codes padded with each row's last zero point are the
    same weights, then zeros."""
    torch.manual_seed(1)
    w = torch.randn(5, 40)
    scale, zp = numerics.weight_only_qparams(w, 4, 16, symmetric=False)
    codes = numerics.quantize_weight_groups(w, scale, zp, 4, 16)
    padded = numerics.pad_codes(codes.numpy(), zp.numpy(), 48)
    assert padded.shape == (5, 48) and (padded[:, :40] == codes.numpy()).all()
    back = numerics.dequantize_weight_groups(torch.from_numpy(padded), scale, zp, 16)
    assert torch.equal(back[:, :40], numerics.dequantize_weight_groups(codes, scale, zp, 16))
    assert torch.equal(back[:, 40:], torch.zeros(5, 8))


def test_presets_parse():
    int4 = QuantConfig.from_name("int4-weight").weight_only
    assert int4 == WeightOnly(bits=4, group_size=128, symmetric=False, method="awq", embeddings=True, embedding_bits=8)
    assert int4.table_scheme() == (8, None, True)
    int8 = QuantConfig.from_name("int8-weight").weight_only
    assert int8 == WeightOnly(bits=8, group_size=None, symmetric=True, method="rtn")
    assert "float activations" in QuantConfig.from_name("int4-weight").describe_weights()
    for bad in (dict(bits=3), dict(group_size=0), dict(method="hqq"), dict(gptq_damping=0.0)):
        with pytest.raises(QuantizeError):
            WeightOnly(**bad)
    with pytest.raises(QuantizeError):
        QuantConfig(weight_only="int4")


class Mlp(torch.nn.Module):
    def __init__(self, k=96, hidden=80, bias=True, out=40):
        super().__init__()
        self.up = torch.nn.Linear(k, hidden, bias=bias)
        self.down = torch.nn.Linear(hidden, out, bias=bias)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


def _dequantized_eager(model, scheme: WeightOnly):
    """`model` with every linear's weight replaced by its round-to-nearest dequantization."""
    import copy
    eager = copy.deepcopy(model)
    for mod in eager.modules():
        if isinstance(mod, torch.nn.Linear):
            w = mod.weight.detach()
            g = scheme.group_size or w.shape[1]
            s, z = numerics.weight_only_qparams(w, scheme.bits, g, scheme.symmetric)
            mod.weight = torch.nn.Parameter(numerics.dequantize_weight_groups(
                numerics.quantize_weight_groups(w, s, z, scheme.bits, g), s, z, g))
    return eager


@pytest.mark.parametrize("scheme", [WeightOnly(4, 32), WeightOnly(4, 64, symmetric=True),
                                    WeightOnly(8, None, symmetric=True), WeightOnly(4, 48)])
def test_reference_equals_eager_dequantized(scheme):
    torch.manual_seed(1)
    model, x = Mlp().eval(), torch.randn(2, 5, 96)
    cm = qlower.compile(model, (x,), quantize=QuantConfig(weight_only=scheme), calibration=[(x,)],
                        backend="reference")
    assert cm.report().quantized
    assert cm.report().op_counts.get("qlower::linear_weight_only") == 2
    with torch.no_grad():
        assert torch.equal(cm(x), _dequantized_eager(model, scheme)(x))


def _within_profile(got, ref_cm, x, model, scheme):
    """|engine - reference| <= the reordered fp32 sum bound, per element, through both linears
    (the second linear's bound from the reference's own hidden values, plus the first one's
    difference propagated by |W2| and SiLU's slope, at most 1.1)."""
    eager = _dequantized_eager(model, scheme)
    with torch.no_grad():
        h = eager.up(x)
        b1 = numerics.reordered_sum_bound(x, eager.up.weight, eager.up.bias)
        a = torch.nn.functional.silu(h)
        b2 = numerics.reordered_sum_bound(a, eager.down.weight, eager.down.bias)
        bound = b2 + torch.nn.functional.linear(1.1 * b1 + 4 * 2.0 ** -24 * a.abs().double(),
                                                eager.down.weight.abs().double())
        want = ref_cm(x)
    diff = (got - want).abs().double()
    assert bool((diff <= bound).all()), f"worst excess {(diff - bound).max().item()}"
    return diff


@pytest.mark.parametrize("scheme", [WeightOnly(4, 32), WeightOnly(4, 64, symmetric=True),
                                    WeightOnly(8, None, symmetric=True), WeightOnly(8, 32), WeightOnly(4, 48)])
def test_onnxruntime_matmulnbits_within_profile(scheme, tmp_path):
    torch.manual_seed(2)
    model, x = Mlp().eval(), torch.randn(2, 5, 96)
    config = QuantConfig(weight_only=scheme)
    cm = qlower.compile(model, (x,), quantize=config, calibration=[(x,)], backend="onnxruntime")
    ref = qlower.compile(model, (x,), quantize=config, calibration=[(x,)], backend="reference")
    assert [c.backend for c in cm.report().clusters] == ["onnxruntime"]
    qlower.export(cm, tmp_path / "m.onnx", format="onnx", onnx_ops="onnxruntime")   # the session's own kernels
    nodes = onnx.load(str(tmp_path / "m.onnx")).graph.node
    nbits = [n for n in nodes if n.op_type == "MatMulNBits"]
    if scheme.bits == 8:   # no fp32-compute 8-bit kernel: the weight dequantized once, for a MatMul
        assert not nbits and sum(n.op_type == "MatMul" for n in nodes) == 2
    else:
        assert len(nbits) == 2
        attrs = {a.name: a.i for a in nbits[0].attribute}
        assert attrs["bits"] == scheme.bits and attrs["accuracy_level"] == 1 and attrs["K"] == 96
    with torch.no_grad():
        _within_profile(cm(x), ref, x, model, scheme)


@pytest.mark.skipif(not HAS_OPENVINO, reason='pip install "qlower[openvino]"')
@pytest.mark.parametrize("scheme", [WeightOnly(4, 32), WeightOnly(4, 64), WeightOnly(8, None, symmetric=True)])
def test_openvino_compressed_weights_within_profile(scheme):
    """The plugin's FullyConnected reads the u4 / u8 codes (its compressed-weight GEMM; with
    groups of 64 over K = 224 too, the last group shorter), within the profile. (The plugin
    decompresses weights below about 16k values at compile time: the layers here are larger.)"""
    import openvino as ov
    torch.manual_seed(3)
    model, x = Mlp(k=224, hidden=256, out=128).eval(), torch.randn(2, 5, 224)
    config = QuantConfig(weight_only=scheme)
    cm = qlower.compile(model, (x,), quantize=config, calibration=[(x,)], backend="openvino")
    ref = qlower.compile(model, (x,), quantize=config, calibration=[(x,)], backend="reference")
    assert [c.backend for c in cm.report().clusters] == ["openvino"]
    core = ov.Core()
    runtime = core.compile_model(core.read_model(cm.report().clusters[0].onnx, b""), "CPU",
                                 {"INFERENCE_PRECISION_HINT": "f32"}).get_runtime_model()
    weights = [str(op.input(1).get_element_type()) for op in runtime.get_ordered_ops()
               if op.get_rt_info()["layerType"].astype(str) == "FullyConnected"]
    code_type = "uint4_t" if scheme.bits == 4 else "uint8_t"
    assert weights == [f"<Type: '{code_type}'>"] * 2, weights
    with torch.no_grad():
        _within_profile(cm(x), ref, x, model, scheme)


def _iree_clusters(cm):
    from qlower.backends.iree.runner import IreeCluster
    return [m for m in cm._executable.module.modules() if isinstance(m, IreeCluster)]


@pytest.mark.skipif(not HAS_IREE, reason='pip install "qlower[iree]"')
@pytest.mark.parametrize("scheme", [WeightOnly(4, 32), WeightOnly(4, 64, symmetric=True),
                                    WeightOnly(8, None, symmetric=True), WeightOnly(8, 32)])
def test_iree_weight_only_within_profile(scheme):
    """Both linears and the SiLU are one IREE cluster (the codes i4/i8 constants of its module),
    every element within the reordered-sum bound of the reference; groups of 32 over the second
    linear's 80 inputs and of 64 over both (96 and 80) end with a shorter group."""
    torch.manual_seed(9)
    model, x = Mlp().eval(), torch.randn(2, 5, 96)
    config = QuantConfig(weight_only=scheme)
    cm = qlower.compile(model, (x,), quantize=config, calibration=[(x,)], backend="iree")
    ref = qlower.compile(model, (x,), quantize=config, calibration=[(x,)], backend="reference")
    assert [c.backend for c in cm.report().clusters] == ["iree"], cm.report()
    assert cm.report().clusters[0].ops.get("qlower::linear_weight_only") == 2
    (cluster,) = _iree_clusters(cm)
    assert f"xi{scheme.bits}>" in cluster.mlir and "linalg.matmul" in cluster.mlir
    with torch.no_grad():
        _within_profile(cm(x), ref, x, model, scheme)


@pytest.mark.skipif(not HAS_IREE, reason='pip install "qlower[iree]"')
def test_iree_weight_only_dynamic_rows():
    """Batch and sequence dynamic: one module (its row count read at run time), within the bound
    at sizes other than the example's."""
    torch.manual_seed(12)
    model, x = Mlp(hidden=64).eval(), torch.randn(2, 5, 96)
    config = QuantConfig(weight_only=WeightOnly(4, 32))
    dynamic = {"x": {0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("seq", min=2, max=16)}}
    cm = qlower.compile(model, (x,), quantize=config, calibration=[(x,)], backend="iree", dynamic_shapes=dynamic)
    ref = qlower.compile(model, (x,), quantize=config, calibration=[(x,)], backend="reference",
                         dynamic_shapes=dynamic)
    assert [c.backend for c in cm.report().clusters] == ["iree"], cm.report()
    for shape in ((1, 3, 96), (4, 9, 96)):
        other = torch.randn(shape)
        with torch.no_grad():
            _within_profile(cm(other), ref, other, model, config.weight_only)


@pytest.mark.skipif(not HAS_IREE, reason='pip install "qlower[iree]"')
@pytest.mark.parametrize("bits,dequantize", [(4, "load"), (8, "load"), (4, "call")])
def test_iree_module_holds_codes_not_fp32_weights(bits, dequantize):
    """The compiled module is smaller than the float model's by most of the fp32 weights' size:
    IREE neither evaluated the dequantization into fp32 constants at compile time (it did for i8
    codes with IREE's compile-time const-eval on; qlower turns it off) nor kept the float weights."""
    from qlower.backends.iree import IreeOptions
    torch.manual_seed(10)
    model, x = Mlp(k=256, hidden=512, out=256).eval(), torch.randn(1, 4, 256)
    options = IreeOptions(weight_only_dequantize=dequantize)
    config = QuantConfig(weight_only=WeightOnly(bits, 64 if bits == 4 else None, symmetric=bits == 8))
    cm = qlower.compile(model, (x,), quantize=config, calibration=[(x,)], backend="iree", backend_options=options)
    fp = qlower.compile(model, (x,), backend="iree", backend_options=options)
    (quantized,), (floating,) = _iree_clusters(cm), _iree_clusters(fp)
    fp32_bytes = 4 * sum(m.weight.numel() for m in (model.up, model.down))
    saved = len(floating.vmfb) - len(quantized.vmfb)
    assert saved > (0.75 if bits == 4 else 0.6) * fp32_bytes, (len(floating.vmfb), len(quantized.vmfb), fp32_bytes)
    ref = qlower.compile(model, (x,), quantize=config, calibration=[(x,)], backend="reference")
    with torch.no_grad():
        _within_profile(cm(x), ref, x, model, config.weight_only)


class TiedLM(torch.nn.Module):
    def __init__(self, vocab=64, dim=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.mid = torch.nn.Linear(dim, dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(torch.relu(self.mid(self.embed(ids))))


@pytest.mark.skipif(not HAS_IREE, reason='pip install "qlower[iree]"')
def test_iree_weight_only_embedding_runs_in_pytorch():
    """Near miss: IREE has no lowering of the weight-only embedding (a gather of codes); it runs in
    PyTorch with the reason (bit-exact), both linears in IREE, each within its bound."""
    torch.manual_seed(13)
    model, ids = TiedLM().eval(), torch.randint(0, 64, (1, 6))
    config = QuantConfig(weight_only=WeightOnly(4, 16, embeddings=True))
    cm = qlower.compile(model, (ids,), quantize=config, calibration=[(ids,)], backend="iree")
    ref = qlower.compile(model, (ids,), quantize=config, calibration=[(ids,)], backend="reference")
    clusters = cm.report().clusters
    assert [c.backend for c in clusters] == ["iree", "pytorch"], cm.report()
    assert clusters[0].ops.get("qlower::linear_weight_only") == 2
    assert "qlower::embedding_weight_only: no IREE lowering" in clusters[1].reason
    w = {}
    for name in ("head", "mid"):   # the tied table is stored under the head's name
        codes, scale, zp = (dict(ref.graph_module.named_buffers())[f"{name}.weight_wo_{s}"]
                            for s in ("codes", "scale", "zero_point"))
        w[name] = numerics.dequantize_weight_groups(codes, scale, zp, 16)
    with torch.no_grad():
        e = w["head"][ids]
        b1 = numerics.reordered_sum_bound(e, w["mid"], model.mid.bias)
        a = torch.relu(torch.nn.functional.linear(e, w["mid"], model.mid.bias))
        bound = numerics.reordered_sum_bound(a, w["head"]) + torch.nn.functional.linear(b1, w["head"].abs().double())
        diff = (cm(ids) - ref(ids)).abs().double()
    assert bool((diff <= bound).all()), f"worst excess {(diff - bound).max().item()}"


def test_embedding_option():
    """Default: the embedding and the tied head stay float (one weight-only linear); with
    embeddings=True both read one set of codes; onnxruntime's gather is bit-exact and the
    head within the profile."""
    torch.manual_seed(4)
    model, ids = TiedLM().eval(), torch.randint(0, 64, (1, 6))
    default = qlower.compile(model, (ids,), quantize=QuantConfig(weight_only=WeightOnly(4, 32)),
                             calibration=[(ids,)], backend="reference")
    counts = default.report().op_counts
    assert counts.get("qlower::linear_weight_only") == 1 and "qlower::embedding_weight_only" not in counts
    assert any("kept float" in note for note in default.report().notes), default.report().notes
    config = QuantConfig(weight_only=WeightOnly(4, 32, embeddings=True))
    ref = qlower.compile(model, (ids,), quantize=config, calibration=[(ids,)], backend="reference")
    counts = ref.report().op_counts
    assert counts.get("qlower::linear_weight_only") == 2 and counts.get("qlower::embedding_weight_only") == 1
    codes = [b for n, b in ref.graph_module.named_buffers() if n.endswith("_wo_codes")]
    assert len(codes) == 2                                   # mid and the shared embedding / head table
    ort = qlower.compile(model, (ids,), quantize=config, calibration=[(ids,)], backend="onnxruntime")
    assert [c.backend for c in ort.report().clusters] == ["onnxruntime"]
    with torch.no_grad():
        got, want = ort(ids), ref(ids)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


class Lookup(torch.nn.Module):
    def __init__(self, vocab=64, dim=40):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)

    def forward(self, ids):
        return self.embed(ids)


@pytest.mark.parametrize("table,group,want", [(8, 32, (8, 1)), (4, 32, (4, 2)), (None, 16, (4, 3))])
def test_embedding_bits(table, group, want):
    """embedding_bits gives a table (and the head tied to it) its own scheme while the other
    linears keep theirs: 8, per row symmetric; 4, the linears' groups; None, the linears' own
    scheme. Each op carries its bits and group, and the onnxruntime lookup is the reference's
    bit for bit, also where the group does not divide the row (dim 40 in groups of 32)."""
    torch.manual_seed(6)
    ids = torch.randint(0, 64, (2, 5))
    scheme = WeightOnly(4, group, embeddings=True, embedding_bits=table)
    bits, groups = want
    assert scheme.table_scheme()[0] == bits
    config = QuantConfig(weight_only=scheme)
    model = TiedLM(dim=40).eval()
    ref = qlower.compile(model, (ids,), quantize=config, calibration=[(ids,)], backend="reference")
    tables = [n for n in ref.graph_module.graph.nodes if n.op == "call_function" and "weight_only" in str(n.target)]
    heads = [n for n in tables if n.args[4] is None and "linear" in str(n.target)]   # the bias-free head
    lookup = next(n for n in tables if "embedding" in str(n.target))
    assert lookup.args[4] == bits and heads[0].args[5] == bits
    scale = dict(ref.graph_module.named_buffers())[lookup.args[2].target]
    assert scale.shape == (64, groups)
    mid = next(n for n in tables if "linear" in str(n.target) and n.args[4] is not None)
    assert mid.args[5] == 4 and mid.args[6] == group   # the other linear keeps the linears' scheme
    lookups = Lookup(dim=40).eval()
    with torch.no_grad():
        want_rows = qlower.compile(lookups, (ids,), quantize=config, calibration=[(ids,)], backend="reference")(ids)
    ort = qlower.compile(lookups, (ids,), quantize=config, calibration=[(ids,)], backend="onnxruntime")
    assert [c.backend for c in ort.report().clusters] == ["onnxruntime"]
    assert torch.equal(ort(ids), want_rows)


def test_int8_compute_keeps_8_bit_weights_in_matmulnbits():
    """With weight_only_compute="int8" an 8-bit weight stays 8-bit in the session (MatMulNBits,
    accuracy level 4), close to the reference but its own numerics."""
    from qlower.backends.onnxruntime import OrtOptions
    torch.manual_seed(2)
    model, x = Mlp().eval(), torch.randn(2, 5, 96)
    config = QuantConfig(weight_only=WeightOnly(8, None, symmetric=True))
    cm = qlower.compile(model, (x,), quantize=config, calibration=[(x,)], backend="onnxruntime",
                        backend_options=OrtOptions(weight_only_compute="int8"))
    ref = qlower.compile(model, (x,), quantize=config, calibration=[(x,)], backend="reference")
    model_onnx = onnx.load_from_string(cm.report().clusters[0].onnx)
    levels = [{a.name: a.i for a in n.attribute}["accuracy_level"] for n in model_onnx.graph.node
              if n.op_type == "MatMulNBits"]
    assert levels == [4, 4]
    with torch.no_grad():
        got, want = cm(x), ref(x)
    assert not torch.equal(got, want) and torch.allclose(got, want, rtol=0.05, atol=0.05)


def test_embedding_bits_needs_embeddings():
    with pytest.raises(QuantizeError, match="embeddings=False"):
        WeightOnly(4, 128, embedding_bits=8)
    with pytest.raises(QuantizeError):
        WeightOnly(4, 128, embeddings=True, embedding_bits=2)
    assert "embeddings 8-bit per row" in WeightOnly(4, 128, embeddings=True, embedding_bits=8).describe()


def test_gptq_beats_round_to_nearest_on_correlated_inputs():
    """GPTQ's output error ||XW^T - XQ^T|| on inputs with a few large, correlated channels is
    below round to nearest's with the same group qparams scheme."""
    torch.manual_seed(5)
    base = torch.randn(512, 8)
    x = base @ torch.randn(8, 64) + 0.05 * torch.randn(512, 64)
    x[:, :4] *= 20
    w = torch.randn(48, 64)
    errors = {}
    for method in ("rtn", "gptq"):
        if method == "gptq":
            codes, s, z = gptq(w, x.double().T @ x.double(), 4, 32, False)
        else:
            s, z = numerics.weight_only_qparams(w, 4, 32, False)
            codes = numerics.quantize_weight_groups(w, s, z, 4, 32)
        assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
        dq = numerics.dequantize_weight_groups(codes, s, z, 32)
        errors[method] = ((x @ w.T - x @ dq.T).pow(2).sum() / (x @ w.T).pow(2).sum()).item()
    assert errors["gptq"] < 0.7 * errors["rtn"], errors


def test_gptq_batched_equals_one_by_one():
    """Weights of one shape run through one column loop give each weight's own GPTQ codes."""
    from qlower.quantize.gptq import gptq_batched
    torch.manual_seed(8)
    w, x = torch.randn(2, 40, 96), torch.randn(2, 300, 96)
    h = x.double().transpose(1, 2) @ x.double()
    codes, scale, zp = gptq_batched(w, h, 4, 32, False)
    for i in range(2):
        one = gptq(w[i], h[i], 4, 32, False)
        assert torch.equal(one[0], codes[i]) and torch.equal(one[1], scale[i]) and torch.equal(one[2], zp[i])


def test_awq_search_never_worse_than_unscaled():
    torch.manual_seed(6)
    x = torch.randn(256, 64)
    x[:, 3] *= 30
    w = torch.randn(32, 64)
    alpha, err, base = awq_search(x, w, x.abs().mean(0), WeightOnly(4, 32))
    assert err <= base and alpha > 0 and err < base


def _output_error(x, w, scheme, ratio=None):
    """||X W^T - X Q(clip(W))^T||^2 / ||X W^T||^2 with round to nearest."""
    from qlower.quantize.awq import fake_quant
    g = scheme.group_size or w.shape[1]
    clipped = w if ratio is None else numerics.clip_weight_groups(w, ratio, g)
    return ((x @ w.T - x @ fake_quant(clipped, scheme).T).pow(2).sum() / (x @ w.T).pow(2).sum()).item()


@pytest.mark.parametrize("symmetric", [False, True])
def test_awq_clip_clamps_outliers_of_quiet_inputs(symmetric):
    """One large weight per group on an input channel that calibration barely drives: clamping it
    costs almost nothing and gives the group's other weights a finer step, so the search clips
    (ratio < 1) and the output error drops well below round to nearest's."""
    torch.manual_seed(11)
    scheme = WeightOnly(4, 32, symmetric=symmetric)
    x, w = torch.randn(256, 96), torch.randn(24, 96)
    quiet = torch.arange(5, 96, 32)            # one column in each of the 3 groups
    x[:, quiet] *= 0.01
    w[:, quiet] = 12.0
    h = x.double().T @ x.double()
    ratio = clip_ratios(w, h, scheme)
    assert ratio.shape == (24, 3) and bool((ratio < 1).all()) and float(ratio.min()) >= 0.5
    clipped = numerics.clip_weight_groups(w, ratio, 32)
    assert float(clipped.max()) < 12.0 and torch.equal(clipped[:, 0:5], w[:, 0:5])   # only the outliers move
    assert _output_error(x, w, scheme, ratio) < 0.5 * _output_error(x, w, scheme)


def test_awq_clip_keeps_weights_already_on_the_grid():
    """Near miss: weights that are exactly 4-bit codes of their group's own grid (both ends of the
    range on a code) quantize without error, so every clip ratio stays 1 and the weight is
    unchanged bit for bit."""
    torch.manual_seed(12)
    codes = torch.randint(0, 16, (24, 96))
    codes[:, 0::32], codes[:, 1::32] = 0, 15   # each group spans its whole grid
    w = (codes - 4).float() * 0.125            # s = (1.375 + 0.5) / 15 = 0.125, zp = 4: exact
    x = torch.randn(256, 96)
    assert _output_error(x, w, WeightOnly(4, 32)) == 0.0
    ratio = clip_ratios(w, x.double().T @ x.double(), WeightOnly(4, 32))
    assert bool((ratio == 1).all())
    assert torch.equal(numerics.clip_weight_groups(w, ratio, 32), w)
    with pytest.raises(qlower.errors.NumericsError):
        numerics.clip_weight_groups(w, torch.zeros_like(ratio), 32)


def test_awq_clip_in_compile_lowers_the_error():
    """method="awq" clips by default (the report counts the clipped weights) and, with outlier
    weights on quiet input channels, its outputs on held-out inputs are closer to float than
    with awq_clip=False; the clip is deterministic (two compiles give the same bits)."""
    torch.manual_seed(13)
    model = Mlp().eval()
    quiet = torch.arange(7, 96, 32)
    with torch.no_grad():
        model.up.weight[:, quiet] = 1.5

    def inputs(n):
        x = torch.randn(n, 96)
        x[:, quiet] *= 0.01
        return x
    calibration, x = [(inputs(32),) for _ in range(4)], inputs(64)
    with torch.no_grad():
        want = model(x)
        got = {}
        for clip in (True, False, True):
            config = QuantConfig(weight_only=WeightOnly(4, 32, method="awq", awq_clip=clip))
            cm = qlower.compile(model, (x,), quantize=config, calibration=calibration, backend="reference")
            notes = " ".join(cm.report().notes)
            assert ("clipped" in notes) == clip, notes
            if clip in got:
                assert torch.equal(cm(x), got[clip])
            got[clip] = cm(x)
    errors = {clip: (y - want).pow(2).sum().item() for clip, y in got.items()}
    assert errors[True] < 0.7 * errors[False], errors


def test_block_lm_int4_weight_one_cluster():
    """The block-op LM (KV cache, attention, rotary as block ops) with int4-weight: one
    onnxruntime cluster, block ops unchanged, every linear a MatMulNBits, within the profile of
    the reference on one decoding step (loose bound: the logits' scale)."""
    torch.manual_seed(7)
    model = BlockDecoderLM(layers=1).eval()
    tok, pos = torch.tensor([[3]]), torch.tensor(0)
    calibration = [(torch.tensor([[i]]), torch.tensor(i)) for i in range(4)]
    cm = qlower.compile(model, (tok, pos), quantize="int4-weight", calibration=calibration, backend="onnxruntime")
    report = cm.report()
    assert [c.backend for c in report.clusters if c.status not in ("state", "constant")] == ["onnxruntime"]
    assert report.op_counts.get("qlower::linear_weight_only") == 6        # q, kv, o, 2 mlp, head
    assert report.op_counts.get("qlower::attention") == 1 and report.op_counts.get("qlower::kv_cache_update")
    model.reset()
    ref = qlower.compile(model, (tok, pos), quantize="int4-weight", calibration=calibration, backend="reference")
    with torch.no_grad():
        for step in range(3):
            got, want = cm(tok, torch.tensor(step)), ref(tok, torch.tensor(step))
            assert (got - want).abs().max().item() < 1e-4 * (1 + want.abs().max().item())


@pytest.mark.slow
def test_smollm2_int8_weight_accuracy():
    """Real SmolLM2-135M weights, the held-out bundled text (1,076 tokens): int8-weight
    perplexity within 0.5% of fp32 (the issue's target; docs/llm.md has the measured numbers),
    and the compiled program's logits equal an independent plain-PyTorch fake quantization of
    every nn.Linear but the tied lm_head (per output channel, symmetric, s = max|w| / 127, round
    half to even) up to float rounding, with the same next token everywhere: its top-1 agreement
    with fp32 (96%, below the issue's 99%) is the model's own sensitivity, not qlower's."""
    import copy

    from qlower.zoo import smollm2
    from qlower.zoo.weight_only_eval import compile_prefill, perplexity, texts
    if not smollm2.available():
        pytest.skip(smollm2.INSTALL_HINT)
    model = smollm2.build_prefill()
    ids, _ = texts()
    cm = compile_prefill(model, "int8-weight")
    fake = copy.deepcopy(model)
    for name, m in fake.named_modules():
        if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head"):
            s = m.weight.detach().abs().amax(1, keepdim=True) / 127
            m.weight = torch.nn.Parameter(torch.round(m.weight.detach() / s) * s, requires_grad=False)
    with torch.no_grad():
        want, got, independent = model(ids), cm(ids), fake(ids)
    assert abs(perplexity(got, ids) / perplexity(want, ids) - 1) < 0.005
    assert (got - independent).abs().max().item() < 1e-3 * independent.abs().max().item()
    assert torch.equal(got.argmax(-1), independent.argmax(-1))


def test_quantized_program_compiles_saves_and_loads(tmp_path):
    """qlower.quantize(config="int4-weight") gives a program compile takes as already quantized;
    its artifact loads and computes the same bits."""
    torch.manual_seed(10)
    model, x = Mlp().eval(), torch.randn(2, 96)
    ep = qlower.quantize(model, (x,), [(x,)], config="int4-weight")
    cm = qlower.compile(ep, (x,), backend="onnxruntime")
    assert cm.report().quantized and cm.report().op_counts.get("qlower::linear_weight_only") == 2
    cm.save(tmp_path / "m.pt2")
    with torch.no_grad():
        assert torch.equal(qlower.load(tmp_path / "m.pt2")(x), cm(x))
