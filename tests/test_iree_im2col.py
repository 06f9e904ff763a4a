"""IREE backend: int8 groups-1 convs emitted as qlower's own im2col (zero-point padding, strided
slices concatenated along channels, one i8 x i8 -> i32 linalg.matmul; docs/iree.md) are
bit-exact against the reference backend and against the direct `tosa.conv2d` form
(`IreeOptions(conv_im2col=False)`), for both numerics profiles. Skipped without the `iree` extra."""
import copy

import pytest
import torch

pytest.importorskip("iree.compiler", reason="the iree extra is not installed (pip install 'qlower[iree]')")
pytest.importorskip("iree.runtime", reason="the iree extra is not installed (pip install 'qlower[iree]')")

from qlower.backends.iree import IreeBackend, IreeOptions  # noqa: E402

ops = torch.ops.qlower


class Conv(torch.nn.Module):
    """qlower conv2d (int32 accumulator) + requantize; returns both."""

    def __init__(self, cin, cout, k, stride, padding, dilation=1, groups=1, x_zp=0, x_dtype=torch.uint8, w_zp=0,
                 w_dtype=torch.int8, profile="fixed", bias=True, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        kh, kw = (k, k) if isinstance(k, int) else k
        lo, hi = (0, 256) if w_dtype == torch.uint8 else (-128, 128)
        self.register_buffer("w", torch.randint(lo, hi, (cout, cin // groups, kh, kw), generator=g, dtype=w_dtype))
        self.register_buffer("w_zp", torch.full((cout,), w_zp, dtype=torch.int32))
        self.register_buffer("bias", torch.randint(-3000, 3000, (cout,), generator=g, dtype=torch.int32)
                             if bias else None)
        # per-channel weights: one accumulator scale per output channel
        self.register_buffer("acc_scale", torch.rand(cout, generator=g) * 1e-4 + 1e-6)
        pair = (lambda v: [v, v] if isinstance(v, int) else list(v))
        self.conv = (pair(stride), pair(padding), pair(dilation), groups)
        self.x_zp, self.x_dtype, self.profile = x_zp, x_dtype, profile

    def forward(self, x):
        acc = ops.conv2d(x, self.x_zp, self.w, self.w_zp, self.bias, *self.conv)
        qmin, qmax = (0, 255) if self.x_dtype == torch.uint8 else (-128, 127)
        y = ops.requantize(acc, self.acc_scale, 0.05, 3 if qmin == 0 else -2, qmin, qmax, self.x_dtype, 1,
                           self.profile)
        return y, acc


def random_q(shape, dtype, seed=0):
    lo, hi = (0, 256) if dtype == torch.uint8 else (-128, 128)
    return torch.randint(lo, hi, shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def run(module, x, options=None, dynamic_shapes=None):
    ep = torch.export.export(module, (x,), dynamic_shapes=dynamic_shapes)
    gm = ep.module()
    exe = IreeBackend(options or IreeOptions()).compile(copy.deepcopy(gm))
    bad = [(c.id, c.status, c.reason) for c in exe.clusters if c.backend != "iree" or c.status != "compiled"]
    assert not bad, bad
    return gm, exe


def mlir_of(exe) -> str:
    return next(m for m in exe.module.modules() if type(m).__name__ == "IreeCluster").mlir


def assert_equal(ref, got):
    assert ref.dtype == got.dtype and ref.shape == got.shape
    diff = ref.to(torch.int64) != got.to(torch.int64)
    assert int(diff.sum()) == 0, f"{int(diff.sum())} of {ref.numel()} elements differ"


CASES = {
    "3x3-s1-p1-u8": dict(cin=3, cout=8, k=3, stride=1, padding=1, x_zp=126),
    "3x3-s2-p1-s8-wzp": dict(cin=4, cout=6, k=3, stride=2, padding=1, x_zp=-7, x_dtype=torch.int8, w_zp=3),
    "3x3-s1-p0-u8w-zp128": dict(cin=3, cout=5, k=3, stride=1, padding=0, x_zp=77, w_zp=128, w_dtype=torch.uint8),
    "3x3-dilation2-p2": dict(cin=5, cout=7, k=3, stride=1, padding=2, dilation=2, x_zp=255),
    "3x3-s2-p0-crop": dict(cin=4, cout=4, k=3, stride=2, padding=0, x_zp=0, x_dtype=torch.int8, bias=False),
    "5x3-s(2,1)-p(2,0)": dict(cin=3, cout=9, k=(5, 3), stride=(2, 1), padding=(2, 0), x_zp=-128,
                              x_dtype=torch.int8),
    "1x1-s1": dict(cin=8, cout=6, k=1, stride=1, padding=0, x_zp=100),
    "1x1-s2": dict(cin=8, cout=6, k=1, stride=2, padding=0, x_zp=0),
    "1x1-s1-p1": dict(cin=4, cout=5, k=1, stride=1, padding=1, x_zp=13, x_dtype=torch.int8, w_zp=-5),
    "3x3-extreme-zp": dict(cin=16, cout=16, k=3, stride=1, padding=1, x_zp=127, x_dtype=torch.int8, w_zp=-128),
}


# the first two cases in the default run, every case under -m slow
@pytest.mark.parametrize("profile", ["fixed", "float"])
@pytest.mark.parametrize("case", [c if i < 2 else pytest.param(c, marks=pytest.mark.slow) for i, c in enumerate(CASES)])
def test_im2col_conv_bit_exact_against_reference_and_direct_conv(case, profile):
    cfg = CASES[case]
    module = Conv(profile=profile, **cfg)
    x = random_q((2, cfg["cin"], 9, 11), cfg.get("x_dtype", torch.uint8), seed=len(case))
    gm, exe = run(module, x)
    _, direct = run(module, x, IreeOptions(conv_im2col=False))
    text = mlir_of(exe)
    assert "tosa.conv2d" not in text and "linalg." in text and "matmul" in text   # the im2col form
    assert "tosa.conv2d" in mlir_of(direct)
    with torch.no_grad():
        ref_y, ref_acc = gm(x)
    got_y, got_acc = exe.run(x)
    dir_y, dir_acc = direct.run(x)
    assert_equal(ref_acc, got_acc)   # the int32 accumulator itself
    assert_equal(ref_y, got_y)
    assert_equal(dir_acc, got_acc)


@pytest.mark.slow
def test_im2col_module_form():
    """3x3 groups-1: 3 column-tap slices, 3 row-tap slices, two concats and an i8 matmul, no
    tosa.conv2d; with zero
    weight zero point the input zero point is folded into the bias (plain linalg.matmul), with
    a non-zero one `linalg.quantized_matmul` takes both."""
    x = random_q((2, 4, 9, 9), torch.uint8)
    _, exe = run(Conv(4, 8, 3, 1, 1, x_zp=130), x)
    text = mlir_of(exe)
    assert text.count("tensor.extract_slice") == 6 and text.count("tensor.concat") == 2 and "linalg.matmul" in text
    assert "tensor.pad" in text and "tosa.conv2d" not in text and "quantized_matmul" not in text
    _, exe = run(Conv(4, 8, 3, 1, 1, x_zp=130, w_zp=2), x)
    assert "linalg.quantized_matmul" in mlir_of(exe)
    _, exe = run(Conv(4, 8, 1, 1, 0, x_zp=130), x)   # a 1x1 conv: a matmul on the input itself
    text = mlir_of(exe)
    assert "tensor.extract_slice" not in text and "linalg.matmul" in text and "tosa.conv2d" not in text


@pytest.mark.parametrize("groups,mult", [(4, 1), (4, 2)])
def test_depthwise_keeps_tosa_depthwise_conv(groups, mult):
    """The near miss: a depthwise conv (groups == channels) keeps tosa.depthwise_conv2d and stays
    bit-exact."""
    x = random_q((2, 4, 9, 9), torch.uint8, seed=3)
    gm, exe = run(Conv(4, 4 * mult, 3, 1, 1, groups=groups, x_zp=9), x)
    text = mlir_of(exe)
    assert "tosa.depthwise_conv2d" in text and "linalg.matmul" not in text
    with torch.no_grad():
        ref_y, ref_acc = gm(x)
    got_y, got_acc = exe.run(x)
    assert_equal(ref_acc, got_acc)
    assert_equal(ref_y, got_y)


@pytest.mark.parametrize("case", ["3x3-s2-p1-s8-wzp", "3x3-s1-p1-u8", "1x1-s1"])
def test_im2col_conv_dynamic_batch(case):
    """One module with a `?` batch dim (tensor.dim for the batch of the gather and matmul) runs
    batch 1, 3 and 5 bit-exactly."""
    cfg = CASES[case]
    module = Conv(**cfg)
    dtype = cfg.get("x_dtype", torch.uint8)
    x = random_q((2, cfg["cin"], 9, 9), dtype)
    gm, exe = run(module, x, dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=16)}})
    assert "tensor<?x" in mlir_of(exe) and "tosa.conv2d" not in mlir_of(exe)
    for b in (1, 3, 5):
        xb = random_q((b, cfg["cin"], 9, 9), dtype, seed=b)
        with torch.no_grad():
            ref_y, ref_acc = gm(xb)
        got_y, got_acc = exe.run(xb)
        assert_equal(ref_acc, got_acc)
        assert_equal(ref_y, got_y)


def test_options_switch_im2col_off():
    assert IreeOptions().conv_im2col is True
    assert "--iree-global-opt-use-im2col-for-convs" in IreeOptions().compile_flags()   # float convs still use IREE's
