"""Complex tensors on ONNX Runtime: torch.onnx writes a complex value as a (real, imaginary)
float pair and translates the complex ops on that form; qlower feeds and reads complex cluster
inputs / outputs as views (backends/onnxruntime/complex_values.py) and refuses up front the ops
torchlib translates for real tensors only."""
from __future__ import annotations

import pytest
import torch

import qlower
from conftest import Fn


def _compiled(fn, *xs):
    cm = qlower.compile(Fn(fn), xs, backend="onnxruntime")
    return cm, cm(*xs)


def _no_fallbacks(cm):
    assert not cm.report().fallbacks, [(c.ops, c.reason) for c in cm.report().fallbacks]


def test_complex_output_of_an_fft():
    x = torch.randn(3, 16)
    cm, got = _compiled(lambda x: torch.fft.fft(x), x)
    _no_fallbacks(cm)
    assert got.dtype == torch.complex64
    torch.testing.assert_close(got, torch.fft.fft(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_inputs_and_outputs(dtype):
    z = torch.randn(3, 8, dtype=dtype)
    fn = lambda z: ((z * z.conj() + z).abs(), torch.fft.ifft(z) * 2)  # noqa: E731
    cm, got = _compiled(fn, z)
    _no_fallbacks(cm)
    want = fn(z)
    assert [g.dtype for g in got] == [w.dtype for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_a_log_spectrogram_is_one_cluster_within_float_tolerance():
    """stft -> |.|^2 -> log: the complex values never leave the cluster. ONNX Runtime's DFT is
    compared with float64 eager: its error is of the order of eager float32's own."""
    def spectrogram(x):
        s = torch.stft(x, 64, hop_length=16, window=torch.hann_window(64, dtype=x.dtype), return_complex=True)
        return s.abs().pow(2).add(1e-3).log()
    x = torch.randn(2, 800, generator=torch.Generator().manual_seed(0))
    cm, got = _compiled(spectrogram, x)
    _no_fallbacks(cm)
    assert len(cm.report().clusters) == 1
    exact = spectrogram(x.double())
    eager_error = (spectrogram(x).double() - exact).abs().max().item()
    assert (got.double() - exact).abs().max().item() <= 10 * eager_error + 1e-6


def test_complex_rotary_embedding_as_in_llama():
    """The reference LLaMA rotary: pairs viewed as complex, multiplied by unit phasors."""
    def rotary(x, angles):
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)
    x, angles = torch.randn(2, 5, 8), torch.randn(5, 4)
    cm, got = _compiled(rotary, x, angles)
    _no_fallbacks(cm)
    torch.testing.assert_close(got, rotary(x, angles))


@pytest.mark.parametrize("fn", [lambda z: z.exp(), lambda z: torch.where(z.real > 0, z, -z), lambda z: z.cumsum(-1),
                                lambda z: z.cumprod(-1), lambda z: torch.nn.functional.pad(z, (1, 2)),
                                lambda z: z.sgn()],
                         ids=["exp", "where", "cumsum", "cumprod (qlower decomposes it for real tensors)",
                              "pad (torchlib's is real-only)", "sgn (decomposed into a real-only where)"])
def test_ops_without_a_complex_translation_are_refused_up_front(fn):
    """Refused by the capability check with their reason, never accepted and then rejected by
    the translator (which would take the whole cluster to PyTorch); values are eager's."""
    z = torch.randn(3, 6, dtype=torch.complex64)
    cm, got = _compiled(lambda z: fn(z * 2) * 3, z)
    reasons = [c.reason for c in cm.report().fallbacks]
    assert reasons and not any("compile failed" in r or "fails to translate" in r for r in reasons), reasons
    assert any("complex" in r or "real tensors only" in r or "cannot translate" in r for r in reasons), reasons
    torch.testing.assert_close(got, fn(z * 2) * 3)


def test_zero_padded_two_dimensional_fft():
    """fft2 with sizes beyond the input's pads a complex tensor: decompositions.py pads the
    (real, imaginary) pairs (torchlib's constant_pad_nd is real-only)."""
    x = torch.randn(3, 5, 6)
    cm, got = _compiled(lambda x: torch.fft.fft2(x, s=(7, 9)), x)
    _no_fallbacks(cm)
    torch.testing.assert_close(got, torch.fft.fft2(x, s=(7, 9)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend, module", [("iree", "iree.compiler"), ("openvino", "openvino")])
def test_other_engines_refuse_complex_ffts_up_front(backend, module):
    """The IREE and OpenVINO capabilities refuse a complex FFT with a reason before compiling
    (IREE's compiler fails on complex tensors; OpenVINO's DFT is not verified), and the answer is
    eager's."""
    pytest.importorskip(module, reason=f"the {backend} extra is not installed (pip install -e .[{backend}])")
    x = torch.randn(3, 16)
    cm = qlower.compile(Fn(lambda x: torch.fft.fft(x)), (x,), backend=backend)
    reasons = [c.reason for c in cm.report().fallbacks]
    assert reasons and not any("fails on it" in r or "compile failed" in r for r in reasons), reasons
    torch.testing.assert_close(cm(x), torch.fft.fft(x))


def test_iree_refuses_windows_and_real_result_ffts_up_front():
    """Window functions and irfft / hfft stay `torch.operator` in iree-compile: refused by the
    capability (not accepted and then dropped by the compiler), the answer eager's."""
    pytest.importorskip("iree.compiler", reason="the iree extra is not installed (pip install -e .[iree])")
    fn = lambda x: torch.fft.irfft(x * torch.hann_window(16)) + torch.fft.hfft(x)  # noqa: E731
    x = torch.randn(3, 16)
    cm = qlower.compile(Fn(fn), (x,), backend="iree")
    reasons = [c.reason for c in cm.report().fallbacks]
    assert len(reasons) == 3 and all("not legalized" in r for r in reasons), reasons
    torch.testing.assert_close(cm(x), fn(x))
