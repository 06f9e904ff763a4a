import importlib.util
import os

import pytest
import torch

import qlower  # noqa: F401  (registers ops)
from qlower import zoo


if os.environ.get("PYTEST_XDIST_WORKER"):
    # one thread per worker: the engines follow torch's thread count (ORT, OpenVINO), and two
    # workers each spinning two ORT threads on two cores slow each other down
    torch.set_num_threads(1)


@pytest.hookimpl(optionalhook=True)   # pytest -p no:xdist knows no such hook
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core this process may use, at most 4 (each worker imports torch,
    transformers and the engines: ~1.5 GB)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


class SmallNet(torch.nn.Module):
    """conv-bn-relu, maxpool, residual add, mean, linear: the lowering's core patterns."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.nn.functional.max_pool2d(y, 2)
        y = torch.relu(self.conv2(y) + y)
        return self.fc(y.mean((2, 3)))


def has_module(name: str) -> bool:
    """`name` importable (find_spec of a submodule raises when its parent package is missing)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


HAS_IREE = has_module("iree.compiler") and has_module("iree.runtime")
HAS_OPENVINO = has_module("openvino")
# The engines installed here (onnxruntime always): the bit-exact-on-every-backend tests' list
ENGINES = ["onnxruntime"] + (["iree"] if HAS_IREE else []) + (["openvino"] if HAS_OPENVINO else [])

HOST_VNNI = qlower.core.cpu.has_vnni()   # this CPU's, read before any test forces it


@pytest.fixture(params=[True, False], ids=["vnni", "no-vnni"])
def vnni(request, monkeypatch):
    """Both integer formulations whatever this CPU is: onnxruntime's VNNI check forced on (s8
    weights in the fused u8 x s8 kernels) and off (u8 weights, or 7-bit ones). The emitted
    form is checked on every CPU; the numerics of the VNNI form only where it is exact
    (`skip_numerics_unless_exact_here`)."""
    from qlower.core import cpu
    monkeypatch.setattr(cpu, "has_vnni", lambda: request.param)
    return request.param


def skip_numerics_unless_exact_here(vnni: bool, full_range_weights: bool = True) -> None:
    """The VNNI formulation with full-range s8 weights is exact only on a CPU with VNNI: ONNX
    Runtime's AVX2 u8 x s8 kernels sum pairs of products in 16 bits and saturate (measured on an
    AVX2-only AMD EPYC: 47-61 of 80 MatMulInteger / MatMulIntegerToFloat / QGemm outputs wrong
    per draw), which is why qlower never emits that form on such a CPU. The non-VNNI form (u8 or
    7-bit weights) is exact, and checked, everywhere."""
    if vnni and full_range_weights and not HOST_VNNI:
        pytest.skip("forced VNNI form with full-range s8 weights: this CPU has no VNNI, so ONNX Runtime's "
                    "kernels saturate on it and qlower never emits it here (its emitted form was checked)")


@pytest.fixture
def small_net():
    torch.manual_seed(0)
    return SmallNet().eval()


def calib(shape, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g),) for _ in range(n)]


@pytest.fixture(scope="session")
def quantized_zoo():
    """Q/DQ programs of the demo models, built once per session."""
    out = {}
    for name in ("cnn", "transformer"):
        e = zoo.get(name)
        out[name] = (e, e.model(), qlower.quantize(e.model(), e.inputs(1), e.calibration(4)))
    return out


class IntegerNet(torch.nn.Module):
    """Only ops that lower to integers (conv, relu, max-pool, residual add, flatten, linear):
    every value between input quantize and output dequantize is an integer tensor."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.dw = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = torch.nn.functional.max_pool2d(y, 2)
        y = torch.relu(self.conv2(y) + y)
        return self.fc(torch.flatten(self.dw(y), 1))


@pytest.fixture
def integer_net():
    torch.manual_seed(0)
    return IntegerNet().eval()


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Tests never read or write the user's ~/.cache/qlower, nor share compiled sessions."""
    import qlower.backends.onnxruntime as ortb
    monkeypatch.setenv("QLOWER_CACHE_DIR", str(tmp_path / "qlower-cache"))
    monkeypatch.setattr(ortb, "_SESSIONS", ortb.cache.LRUCache())
    monkeypatch.setattr(ortb, "_MODELS", ortb.cache.LRUCache())


class Fn(torch.nn.Module):
    """A module around a function of the inputs (one-op and small-graph tests)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


@torch.library.custom_op("qlower_test::opaque", mutates_args=())
def opaque(x: torch.Tensor) -> torch.Tensor:
    """An op no translator knows (a custom op of the tests): what a model's unsupported op looks
    like to every backend, however much of ATen they cover. Elementwise x * 3 - 1."""
    return x * 3 - 1


@opaque.register_fake
def _(x):
    return torch.empty_like(x)


def pipeline_without_empty_folding() -> list:
    """The default pipeline less FoldEmptyTensors: what an engine gets when an empty tensor
    reaches it (its own empty-tensor refusals, kept and tested)."""
    from qlower.passes import FoldEmptyTensors, default_pipeline
    return [p for p in default_pipeline() if not isinstance(p, FoldEmptyTensors)]
