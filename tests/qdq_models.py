"""Hand-written Q/DQ models: exact control over qparams for pass tests."""
import torch
import torch.nn.functional as F

import qlower  # noqa: F401
from qlower.passes import AttachQParams, FoldQuantizedConstants, PassManager

qd = torch.ops.quantized_decomposed


class QDQLinear(torch.nn.Module):
    """x -> Q/DQ -> linear(DQ(w_int8, per-channel on `axis`)) -> [relu] -> Q/DQ."""

    def __init__(self, k=16, n=8, axis=0, relu=False, weight_value=None, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        w = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
        if weight_value is not None:
            w = torch.full((n, k), weight_value, dtype=torch.int8)
        self.register_buffer("w", w)
        channels = w.shape[axis]
        self.register_buffer("ws", torch.rand(channels, generator=g) * 0.01 + 0.001)
        self.register_buffer("wz", torch.zeros(channels, dtype=torch.int64))
        self.axis, self.relu = axis, relu

    def forward(self, x):
        xd = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, 0.05, 0, 0, 255, torch.uint8),
                                      0.05, 0, 0, 255, torch.uint8)
        wd = qd.dequantize_per_channel(self.w, self.ws, self.wz, self.axis, -127, 127, torch.int8)
        y = F.linear(xd, wd)
        if self.relu:
            y = torch.relu(y)
        return qd.dequantize_per_tensor(qd.quantize_per_tensor(y, 0.1, 100, 0, 255, torch.uint8),
                                        0.1, 100, 0, 255, torch.uint8)


class RequantChain(torch.nn.Module):
    """Q -> DQ -> Q (same params) -> DQ: the middle pair is value-preserving."""

    def forward(self, x):
        q = qd.quantize_per_tensor(x, 0.05, 10, 0, 255, torch.uint8)
        d = qd.dequantize_per_tensor(q, 0.05, 10, 0, 255, torch.uint8)
        q2 = qd.quantize_per_tensor(d, 0.05, 10, 0, 255, torch.uint8)
        return qd.dequantize_per_tensor(q2, 0.05, 10, 0, 255, torch.uint8)


def graph_module(model, *inputs):
    return torch.export.export(model, inputs).module()


class WeightChain(torch.nn.Module):
    """int8 weight stored [K, N], dequantized per-channel along N (axis 1), then a shape op."""

    def __init__(self, op, tie=False):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("w", torch.randint(-127, 128, (8, 6), generator=g).to(torch.int8))
        self.register_buffer("s", torch.rand(6, generator=g) * 0.01 + 0.001)
        self.register_buffer("z", torch.zeros(6, dtype=torch.int64))
        self.op, self.tie = op, tie

    def forward(self, x):
        wd = qd.dequantize_per_channel(self.w, self.s, self.z, 1, -127, 127, torch.int8)
        if self.tie:
            return x @ self.op(wd) + (x @ self.op(wd)).relu()
        return x @ self.op(wd)


def folded(model, x, passes=None):
    gm = graph_module(model, x)
    ctx = PassManager(passes or [AttachQParams(), FoldQuantizedConstants()]).run(gm)
    return gm, ctx


# ---- small float models and helpers the per-token and dynamic-quantization tests share
class Mlp(torch.nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.a = torch.nn.Linear(32, 64, bias=bias)
        self.b = torch.nn.Linear(64, 16, bias=bias)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class Qkv(torch.nn.Module):
    """Three projections of one activation (attention's q/k/v), then one of another."""
    def __init__(self, bias=True):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(32, 24, bias=bias) for _ in range(3))
        self.o = torch.nn.Linear(24, 8, bias=bias)

    def forward(self, x):
        return self.o(torch.relu(self.q(x) * self.k(x) + self.v(x)))


def wide_calibration(shape, n=4, seed=0):
    """Calibration batches of N(0, 2^2) inputs."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g) * 2,) for _ in range(n)]


def count_nodes(gm, target):
    return sum(1 for n in gm.graph.nodes if n.target == target)


class IntegerLinear(torch.nn.Module):
    """qlower.linear of an integer input by a constant integer weight (zero weight zero points)."""

    def __init__(self, w, bias, x_zp):
        super().__init__()
        self.register_buffer("w", w)
        self.register_buffer("w_zp", torch.zeros(w.shape[0], dtype=torch.int32))
        self.register_buffer("bias", bias)
        self.x_zp = x_zp

    def forward(self, x):
        return torch.ops.qlower.linear(x, self.x_zp, self.w, self.w_zp, self.bias)


class OpCall(torch.nn.Module):
    """Calls one block op with fixed non-tensor arguments."""

    def __init__(self, fn, **params):
        super().__init__()
        for name, p in params.items():
            self.register_buffer(name, p)
        self.fn = fn

    def forward(self, *xs):
        return self.fn(self, *xs)
