"""Integer ops: reference kernels against plain int64 arithmetic, padding as a real zero,
survival through torch.export save/load."""
import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qlower  # noqa: F401
from qlower import numerics as N

ops = torch.ops.qlower


def rand_int(shape, lo, hi, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, shape, generator=g).to(dtype)


def int64_conv2d(x, zx, w, zw, bias, stride, padding, dilation, groups):
    """Direct int64 convolution via unfold: an independent formulation."""
    xc = x.to(torch.int64) - zx
    xc = torch.nn.functional.pad(xc, (padding[1], padding[1], padding[0], padding[0]))  # real zero
    n, c, h, wd = xc.shape
    oc, icg, kh, kw = w.shape
    wc = w.to(torch.int64) - zw.to(torch.int64).reshape(-1, 1, 1, 1)
    oh = (h - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = torch.zeros(n, oc, oh, ow, dtype=torch.int64)
    ocg = oc // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = xc[:, g * icg:(g + 1) * icg,
                           i * dilation[0]: i * dilation[0] + stride[0] * (oh - 1) + 1: stride[0],
                           j * dilation[1]: j * dilation[1] + stride[1] * (ow - 1) + 1: stride[1]]
                wk = wc[g * ocg:(g + 1) * ocg, :, i, j]
                out[:, g * ocg:(g + 1) * ocg] += torch.einsum("nchw,oc->nohw", patch, wk)
    if bias is not None:
        out += bias.to(torch.int64).reshape(1, -1, 1, 1)
    return out.to(torch.int32)


@pytest.mark.parametrize("stride,padding,dilation,groups", [
    ([1, 1], [1, 1], [1, 1], 1), ([2, 2], [0, 0], [1, 1], 1), ([1, 2], [2, 1], [2, 1], 2),
    ([1, 1], [1, 1], [1, 1], 8)])  # the last one is depthwise
def test_conv2d_matches_int64_reference(stride, padding, dilation, groups):
    x = rand_int((2, 8, 9, 7), 0, 255, torch.uint8)
    w = rand_int((8, 8 // groups, 3, 3), -127, 127, torch.int8, seed=1)
    zw = rand_int((8,), -3, 3, torch.int32, seed=2)
    bias = rand_int((8,), -1000, 1000, torch.int32, seed=3)
    got = ops.conv2d(x, 131, w, zw, bias, stride, padding, dilation, groups)
    assert torch.equal(got, int64_conv2d(x, 131, w, zw, bias, stride, padding, dilation, groups))


def test_padding_is_a_real_zero():
    # An all-zx input is real zero everywhere, padding included: every output must be 0.
    x = torch.full((1, 2, 4, 4), 200, dtype=torch.uint8)
    w = rand_int((3, 2, 3, 3), -127, 127, torch.int8)
    got = ops.conv2d(x, 200, w, torch.zeros(3, dtype=torch.int32), None, [1, 1], [1, 1], [1, 1], 1)
    assert torch.count_nonzero(got) == 0


def test_conv1d_linear_matmul_match_int64():
    x = rand_int((2, 4, 10), 0, 255, torch.uint8)
    w = rand_int((6, 4, 3), -127, 127, torch.int8, seed=1)
    got = ops.conv1d(x, 7, w, torch.zeros(6, dtype=torch.int32), None, [1], [1], [1], 1)
    want = int64_conv2d(x.unsqueeze(2), 7, w.unsqueeze(2), torch.zeros(6, dtype=torch.int32), None,
                        [1, 1], [0, 1], [1, 1], 1).squeeze(2)
    assert torch.equal(got, want)
    a = rand_int((3, 5, 16), 0, 255, torch.uint8, seed=4)
    wl = rand_int((7, 16), -127, 127, torch.int8, seed=5)
    b = rand_int((7,), -50, 50, torch.int32, seed=6)
    got = ops.linear(a, 100, wl, torch.zeros(7, dtype=torch.int32), b)
    assert torch.equal(got, ((a.to(torch.int64) - 100) @ wl.to(torch.int64).t() + b).to(torch.int32))
    m1 = rand_int((2, 3, 5, 8), -128, 127, torch.int8, seed=7)
    m2 = rand_int((2, 3, 8, 4), 0, 255, torch.uint8, seed=8)
    got = ops.matmul(m1, -3, m2, 120)
    assert torch.equal(got, ((m1.to(torch.int64) + 3) @ (m2.to(torch.int64) - 120)).to(torch.int32))


def test_accumulator_overflow_raises_instead_of_wrapping():
    a = torch.full((1, 70000), 255, dtype=torch.uint8)
    w = torch.full((1, 70000), -127, dtype=torch.int8)
    with pytest.raises(OverflowError):
        ops.linear(a, 0, w, torch.zeros(1, dtype=torch.int32), None)


@settings(max_examples=60, deadline=None)
@given(scale=st.floats(1e-4, 10.0), zp=st.integers(0, 255), seed=st.integers(0, 1000))
def test_quantize_dequantize_roundtrip_property(scale, zp, seed):
    q = rand_int((64,), 0, 255, torch.uint8, seed)
    assert torch.equal(N.quantize(N.dequantize(q, scale, zp), scale, zp, 0, 255, torch.uint8), q)


@settings(max_examples=25, deadline=None)
@given(sx=st.floats(1e-3, 0.1), zx=st.integers(0, 255), seed=st.integers(0, 1000))
def test_integer_linear_equals_float_on_dequantized_operands(sx, zx, seed):
    x = rand_int((4, 32), 0, 255, torch.uint8, seed)
    w = rand_int((8, 32), -127, 127, torch.int8, seed + 1)
    sw = torch.rand(8, generator=torch.Generator().manual_seed(seed)) * 0.01 + 1e-3
    acc = ops.linear(x, zx, w, torch.zeros(8, dtype=torch.int32), None)
    y = N.dequantize(acc, N.accumulator_scale(sx, sw), torch.zeros(8, dtype=torch.int32), axis=1)
    xd = N.dequantize(x, sx, zx).double()
    wd = N.dequantize(w, sw, torch.zeros(8, dtype=torch.int32), axis=0).double()
    ref = torch.nn.functional.linear(xd, wd)
    # Proven bound: the integer path rounds twice in fp32 (scale product, final multiply), the
    # reference rounds each dequantized operand once: |err| <= 4 * 2^-24 * sum|x_i * w_i|.
    magnitude = torch.nn.functional.linear(xd.abs(), wd.abs())
    assert torch.all((y.double() - ref).abs() <= 4 * 2.0**-24 * magnitude)


class IntModel(torch.nn.Module):
    def forward(self, x):
        q = ops.quantize(x, torch.tensor([0.05]), torch.tensor([128]), 0, 255, torch.uint8)
        acc = ops.linear(q, 128, torch.ones(3, 4, dtype=torch.int8), torch.zeros(3, dtype=torch.int32), None)
        y = ops.requantize(acc, torch.tensor([0.05]), 0.1, 10, 0, 255, torch.uint8, None, "fixed")
        return ops.dequantize(y, torch.tensor([0.1]), torch.tensor([10]))


def test_integer_ops_survive_export_save_load():
    x = torch.randn(2, 4)
    ep = torch.export.export(IntModel(), (x,))
    targets = {n.target for n in ep.graph.nodes if n.op == "call_function"}
    assert ops.linear.default in targets and ops.requantize.default in targets
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    assert torch.equal(loaded.module()(x), IntModel()(x))


@settings(max_examples=20, deadline=None)
@given(sx=st.floats(1e-3, 0.1), zx=st.integers(0, 255), groups=st.sampled_from([1, 2, 4]),
       stride=st.integers(1, 2), seed=st.integers(0, 1000))
def test_integer_conv_equals_float_on_dequantized_operands(sx, zx, groups, stride, seed):
    x = rand_int((1, 4, 7, 7), 0, 255, torch.uint8, seed)
    w = rand_int((4, 4 // groups, 3, 3), -127, 127, torch.int8, seed + 1)
    sw = torch.rand(4, generator=torch.Generator().manual_seed(seed)) * 0.01 + 1e-3
    zeros = torch.zeros(4, dtype=torch.int32)
    acc = ops.conv2d(x, zx, w, zeros, None, [stride] * 2, [1, 1], [1, 1], groups)
    y = N.dequantize(acc, N.accumulator_scale(sx, sw), zeros, axis=1).double()
    xd, wd = N.dequantize(x, sx, zx).double(), N.dequantize(w, sw, zeros, axis=0).double()
    ref = torch.nn.functional.conv2d(xd, wd, None, stride, 1, 1, groups)
    magnitude = torch.nn.functional.conv2d(xd.abs(), wd.abs(), None, stride, 1, 1, groups)
    assert torch.all((y - ref).abs() <= 4 * 2.0**-24 * magnitude)
