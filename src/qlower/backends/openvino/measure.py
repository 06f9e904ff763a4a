"""Per-op numerics of the openvino backend vs the reference kernels (one-op graphs, random
log-uniform scales and zero points, u8 and s8; add/mul on all 65,536 pairs). The table in
docs/openvino.md comes from `python -m qlower.backends.openvino.measure 12` (about 8 minutes on
2 cores); `... measure 3 add,quantize` runs a subset."""
import sys
import warnings

import torch

from qlower.backends.base import compile_graph
from qlower.backends.openvino import OpenVinoBackend, OvOptions

warnings.filterwarnings("ignore")
ops = torch.ops.qlower
BE = OpenVinoBackend()
NATIVE = OpenVinoBackend(OvOptions(numerics='openvino'))

def run(module, *inputs, be=None):
    gm = torch.export.export(module, inputs).module()
    exe = compile_graph(be or BE, gm)
    with torch.no_grad():
        ref, got = gm(*inputs), exe.run(*inputs)
    st = [(c.backend, c.status, c.reason) for c in exe.clusters if c.status != "compiled" or c.backend != "openvino"]
    return ref, got, st

STATS = {}
def record(name, ref, got, st):
    s = STATS.setdefault(name, dict(trials=0, bad_trials=0, elems=0, differ=0, maxlsb=0, fallback=0))
    s["trials"] += 1
    if st:
        s["fallback"] += 1
        return
    refs = ref if isinstance(ref, tuple) else (ref,)
    gots = got if isinstance(got, tuple) else (got,)
    for r, g in zip(refs, gots):
        assert r.dtype == g.dtype, (r.dtype, g.dtype)
        if r.dtype.is_floating_point:
            d = (r != g) & ~(r.isnan() & g.isnan())
            ri, gi = r.view(torch.int32).to(torch.int64), g.view(torch.int32).to(torch.int64)
            lsb = int((ri - gi).abs()[d].max()) if d.any() else 0   # float: max ULPs (same sign)
        else:
            d = r.to(torch.int64) != g.to(torch.int64)
            lsb = (r.to(torch.int64) - g.to(torch.int64)).abs().max().item() if r.numel() else 0
        s["elems"] += r.numel()
        n = int(d.sum())
        s["differ"] += n
        s["maxlsb"] = max(s["maxlsb"], lsb)
        if n:
            s["bad_trials"] += 1

R = lambda dt: (0, 255) if dt == torch.uint8 else (-128, 127)
def rq(shape, dt, g, lo=None, hi=None):
    a, b = R(dt)
    return torch.randint(a if lo is None else lo, (b if hi is None else hi) + 1, shape, generator=g, dtype=dt)

class Q(torch.nn.Module):
    def __init__(s, scale, zp, dt, axis):
        super().__init__()
        s.register_buffer("s", torch.tensor(scale, dtype=torch.float32))
        s.register_buffer("z", torch.tensor(zp, dtype=torch.int32))
        s.dt, s.axis = dt, axis
    def forward(s, x):
        lo, hi = R(s.dt)
        return ops.quantize(x, s.s, s.z, lo, hi, s.dt, s.axis)
class DQ(Q):
    def forward(s, q): return ops.dequantize(q, s.s, s.z, s.axis)
class RQ(torch.nn.Module):
    def __init__(s, acc_scale, out_scale, zp, lo, hi, dt, axis):
        super().__init__()
        s.register_buffer("a", torch.tensor(acc_scale, dtype=torch.float32))
        s.args = (out_scale, zp, lo, hi, dt, axis, "float")
    def forward(s, acc): return ops.requantize(acc, s.a, *s.args)
class Conv(torch.nn.Module):
    def __init__(s, w, wzp, b, xzp, conv, d1=False):
        super().__init__()
        s.register_buffer("w", w)
        s.register_buffer("wzp", wzp)
        s.register_buffer("b", b)
        s.xzp, s.conv, s.d1 = xzp, conv, d1
    def forward(s, x): return (ops.conv1d if s.d1 else ops.conv2d)(x, s.xzp, s.w, s.wzp, s.b, *s.conv)
class Lin(torch.nn.Module):
    def __init__(s, w, wzp, b, xzp):
        super().__init__()
        s.register_buffer("w", w)
        s.register_buffer("wzp", wzp)
        s.register_buffer("b", b)
        s.xzp = xzp
    def forward(s, x): return ops.linear(x, s.xzp, s.w, s.wzp, s.b)
class MM(torch.nn.Module):
    def __init__(s, az, bz):
        super().__init__()
        s.az, s.bz = az, bz
    def forward(s, a, b): return ops.matmul(a, s.az, b, s.bz)
class Bin(torch.nn.Module):
    def __init__(s, f, args):
        super().__init__()
        s.f, s.args = f, args
    def forward(s, a, b):
        a_s, a_z, b_s, b_z, o_s, o_z, lo, hi, dt = s.args
        return s.f(a, a_s, a_z, b, b_s, b_z, o_s, o_z, lo, hi, dt)
class Pool(torch.nn.Module):
    def __init__(s, args):
        super().__init__()
        s.args = args
    def forward(s, x): return ops.max_pool2d(x, *s.args)
class Mean(torch.nn.Module):
    def __init__(s, zp, dims, keep, lo, hi):
        super().__init__()
        s.args = (zp, dims, keep, lo, hi)
    def forward(s, x): return ops.mean(x, *s.args)

def logscale(g): return float(torch.exp(torch.empty(()).uniform_(-9, 0, generator=g)))

def main(trials, only=None):
    g = torch.Generator().manual_seed(0)
    def want(n): return only is None or n in only
    for t in range(trials):
        for dt in (torch.uint8, torch.int8):
            lo, hi = R(dt)
            tag = "u8" if dt == torch.uint8 else "s8"
            if want("quantize"):
                sc = logscale(g)
                zp = int(torch.randint(lo, hi + 1, (), generator=g))
                x = torch.cat([torch.randn(4000, generator=g) * sc * 100,
                               torch.tensor([0.5, -0.5, 1.5, 2.5, float("inf"), float("-inf"), 1e9, -1e9, 0.,
                                             -0.]) * sc,
                               (torch.arange(-300, 300) + 0.5) * sc])
                record(f"quantize {tag} (numerics='openvino')", *run(Q(sc, zp, dt, None), x, be=NATIVE))
                record(f"quantize {tag} (any scale, canonical)", *run(Q(sc, zp, dt, None), x))
                p2 = 2.0 ** int(torch.randint(-12, 4, (), generator=g))
                x2 = torch.cat([x / sc * p2, torch.tensor([float("nan")])])
                record(f"quantize {tag} (power-of-two scale)", *run(Q(p2, zp, dt, None), x2))
            if want("dequantize"):
                sc = logscale(g)
                zp = int(torch.randint(lo, hi + 1, (), generator=g))
                record(f"dequantize {tag}", *run(DQ(sc, zp, dt, None), torch.arange(lo, hi + 1).to(dt)))
            if want("requantize"):
                C = 8
                acc_s = [logscale(g) * 1e-2 for _ in range(C)]
                osc = logscale(g)
                zp = int(torch.randint(lo, hi + 1, (), generator=g))
                qlo = zp if t % 2 else lo  # fused relu half the time
                acc = torch.cat([torch.randint(-2**31 + 1, 2**31 - 1, (300, C), generator=g),
                                 torch.randint(-50000, 50000, (3000, C), generator=g)]).to(torch.int32)
                record(f"requantize {tag}", *run(RQ(acc_s, osc, zp, qlo, hi, dt, 1), acc))
            if want("conv2d"):
                cin, cout, k = [(3, 8, 3), (64, 16, 3), (16, 16, 1)][t % 3]
                groups = 1
                w = rq((cout, cin, k, k), torch.int8, g, lo=-64 if t % 4 == 3 else None,
                       hi=63 if t % 4 == 3 else None)
                xzp = int(torch.randint(lo, hi + 1, (), generator=g))
                x = rq((1, cin, 10, 10), dt, g)
                if t % 5 == 4:  # extreme accumulators: |sum| beyond 2^24
                    x = torch.full_like(x, hi)
                    xzp = lo
                    w = torch.full_like(w, -128)
                record(f"conv2d {tag}", *run(Conv(w, torch.zeros(cout, dtype=torch.int32),
                                                  torch.randint(-3000, 3000, (cout,), generator=g, dtype=torch.int32),
                                                  xzp, ([1, 1], [1, 1], [1, 1], groups)), x))
            if want("conv1d"):
                w = rq((8, 16, 3), torch.int8, g)
                xzp = int(torch.randint(lo, hi + 1, (), generator=g))
                record(f"conv1d {tag}", *run(Conv(w, torch.zeros(8, dtype=torch.int32),
                                                  torch.randint(-3000, 3000, (8,), generator=g, dtype=torch.int32),
                                                  xzp, ([1], [1], [1], 1), d1=True), rq((1, 16, 20), dt, g)))
            if want("linear"):
                K = [24, 768, 3072][t % 3]
                w = rq((16, K), torch.int8, g)
                xzp = int(torch.randint(lo, hi + 1, (), generator=g))
                x = rq((4, K), dt, g)
                if t % 5 == 4:
                    x = torch.full_like(x, hi)
                    xzp = lo
                    w = torch.full_like(w, -128)
                record(f"linear {tag}", *run(Lin(w, torch.zeros(16, dtype=torch.int32),
                                                 torch.randint(-3000, 3000, (16,), generator=g, dtype=torch.int32),
                                                 xzp), x))
            if want("matmul"):
                K = [16, 64, 768][t % 3]
                az = int(torch.randint(0, 256, (), generator=g))
                bz = int(torch.randint(lo, hi + 1, (), generator=g))
                a, b = rq((2, 5, K), torch.uint8, g), rq((2, K, 7), dt, g)
                if t % 5 == 4:
                    a = torch.full_like(a, 255)
                    az = 0
                    b = torch.full_like(b, lo)
                    bz = hi
                record(f"matmul u8x{tag}", *run(MM(az, bz), a, b))
            for name, f in (("add", ops.add), ("mul", ops.mul)):
                if want(name):
                    args = (logscale(g), int(torch.randint(lo, hi + 1, (), generator=g)),
                            logscale(g), int(torch.randint(lo, hi + 1, (), generator=g)),
                            logscale(g) * (2 if name == "add" else logscale(g)),
                            int(torch.randint(lo, hi + 1, (), generator=g)), lo, hi, dt)
                    a = torch.arange(lo, hi + 1).to(dt)[:, None].expand(-1, 256).contiguous()
                    b = torch.arange(lo, hi + 1).to(dt)[None, :].expand(256, -1).contiguous()
                    record(f"{name} {tag} (all 65,536 pairs)", *run(Bin(f, args), a, b))
            if want("max_pool2d"):
                record(f"max_pool2d {tag}", *run(Pool(([3, 3], [2, 2], [1, 1], [1, 1], False)),
                                                 rq((1, 4, 15, 15), dt, g)))
            if want("mean"):
                zp = int(torch.randint(lo, hi + 1, (), generator=g))
                H = [7, 8, 14][t % 3]
                record(f"mean {tag}", *run(Mean(zp, [2, 3], t % 2 == 0, lo, hi), rq((2, 64, H, H), dt, g)))
        print(f"trial {t} done", flush=True)
    print(f"{'op':32s} trials  trials-differing  elements  differing  max-LSB  refused(PyTorch)")
    for k, s in STATS.items():
        print(f"{k:32s} {s['trials']:5d} {s['bad_trials']:6d} {s['elems']:12d} {s['differ']:9d} {s['maxlsb']:6d} "
              f"{s['fallback']:4d}")

if __name__ == "__main__":
    main(int(sys.argv[1]), set(sys.argv[2].split(",")) if len(sys.argv) > 2 else None)
