"""SmolLM2-135M with weight-only quantization: the measurements of docs/llm.md.

    python -m qlower.zoo.weight_only_eval accuracy [name ...]   # perplexity / top-1, reference backend
    python -m qlower.zoo.weight_only_eval engines                # onnxruntime / openvino vs reference
    python -m qlower.zoo.weight_only_eval speed                  # decode step on onnxruntime, one thread
    python -m qlower.zoo.weight_only_eval kernels                # one MatMulNBits per compute type
    python -m qlower.zoo.weight_only_eval iree                   # one weight-only linear on IREE
"""
from __future__ import annotations

import math
import statistics
import sys
import time

import torch

from ..quantize import QuantConfig, WeightOnly
from . import smollm2

CONFIGS = {
    "int8-weight": "int8-weight",
    "int4 g128 rtn": QuantConfig(weight_only=WeightOnly(4, 128, method="rtn")),
    "int4 g128 gptq": QuantConfig(weight_only=WeightOnly(4, 128, method="gptq")),
    "int4 g128 awq (int4-weight)": "int4-weight",
    "int4 g128 awq+gptq": QuantConfig(weight_only=WeightOnly(4, 128, method="awq+gptq")),
    "int4 g64 rtn": QuantConfig(weight_only=WeightOnly(4, 64, method="rtn")),
    "int4 g64 gptq": QuantConfig(weight_only=WeightOnly(4, 64, method="gptq")),
    "int4 g64 awq": QuantConfig(weight_only=WeightOnly(4, 64, method="awq")),
    "int4 g32 rtn": QuantConfig(weight_only=WeightOnly(4, 32, method="rtn")),
    "int4 g32 gptq": QuantConfig(weight_only=WeightOnly(4, 32, method="gptq")),
}


def texts() -> tuple[torch.Tensor, torch.Tensor]:
    """(held-out second paragraph [1, 182], whole text [1, 385]) token ids."""
    ids = torch.tensor(smollm2.TOKEN_IDS)
    return ids[smollm2.SPLIT:][None], ids[None]


def perplexity(logits: torch.Tensor, ids: torch.Tensor) -> float:
    lp = torch.log_softmax(logits[0, :-1].double(), -1)
    return math.exp(-lp.gather(1, ids[0, 1:, None]).mean().item())


def compile_prefill(model, config, backend: str = "reference", backend_options=None):
    import qlower
    held, _ = texts()
    return qlower.compile(model, (held,), quantize=config, calibration=smollm2.calibration_windows(),
                          backend=backend, backend_options=backend_options,
                          dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=512)},))


def accuracy(names: list[str]) -> None:
    torch.set_num_threads(1)
    model = smollm2.build_prefill()
    held, full = texts()
    with torch.no_grad():
        ref_h, ref_f = model(held), model(full)
    p_h, p_f = perplexity(ref_h, held), perplexity(ref_f, full)
    print(f"{'fp32':30s} ppl {p_h:.3f}  [{p_f:.3f}]", flush=True)
    for name in names:
        start = time.perf_counter()
        cm = compile_prefill(model, CONFIGS[name])
        seconds = time.perf_counter() - start
        with torch.no_grad():
            g_h, g_f = cm(held), cm(full)
        q_h, q_f = perplexity(g_h, held), perplexity(g_f, full)
        top_h = (g_h.argmax(-1) == ref_h.argmax(-1)).double().mean().item()
        top_f = (g_f.argmax(-1) == ref_f.argmax(-1)).double().mean().item()
        print(f"{name:30s} ppl {q_h:.3f} ({100 * (q_h / p_h - 1):+.2f}%)  [{q_f:.3f} ({100 * (q_f / p_f - 1):+.2f}%)]"
              f"  top-1 {100 * top_h:.1f}% [{100 * top_f:.1f}%]  compile {seconds:.0f} s", flush=True)


def ulps(a: torch.Tensor, b: torch.Tensor, floor: float = 1.0) -> int:
    """The largest distance in fp32 units in the last place between a and b over the elements
    with |b| >= floor (near 0 a tiny absolute difference is a huge count of ulps)."""
    ia = a.contiguous().view(torch.int32).to(torch.int64)
    ib = b.contiguous().view(torch.int32).to(torch.int64)
    ia = torch.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    keep = b.abs() >= floor
    return int((ia - ib).abs()[keep].max()) if bool(keep.any()) else 0


def engines(backends: tuple[str, ...] = ("onnxruntime", "openvino"),
            configs: tuple[str, ...] = ("int4 g128 rtn", "int8-weight")) -> None:
    """Logits of the held-out paragraph, each engine vs the reference backend on one program
    (the engines' kernels do not depend on how the codes were chosen: round to nearest)."""
    torch.set_num_threads(1)
    model = smollm2.build_prefill()
    held, _ = texts()
    for config in configs:
        want = compile_prefill(model, CONFIGS[config])(held)
        for backend in backends:
            got = compile_prefill(model, CONFIGS[config], backend)(held)
            diff = (got - want).abs()
            print(f"{config} {backend}: {int((diff > 0).sum())} of {diff.numel()} logits differ, max abs "
                  f"{diff.max().item():.3g} (logits up to {want.abs().max().item():.3g}), max {ulps(got, want)} ulps "
                  f"where |logit| >= 1; "
                  f"top-1 equal at {100 * (got.argmax(-1) == want.argmax(-1)).double().mean().item():.1f}%", flush=True)


def speed(names: list[str], blocks: int = 8, calls: int = 16) -> None:
    """Decode step (128-slot KV cache, batch 1) on onnxruntime with one thread, interleaved blocks."""
    import qlower
    from ..backends.onnxruntime import OrtOptions
    from .realsuite import smollm2_decode
    torch.set_num_threads(1)
    model = smollm2_decode(1).eval()
    token = smollm2.TextWindows(seq=1, stride=1).batch(1, 0)
    position = torch.zeros(1, dtype=torch.int64)
    calibration = [(smollm2.TextWindows(seq=1, stride=1).batch(1, i), torch.tensor([i])) for i in range(8)]
    compiled = {}
    for name in names:   # "<preset>+int8": OrtOptions(weight_only_compute="int8")
        preset, _, compute = name.partition("+")
        start = time.perf_counter()
        config = None if preset == "fp32" else CONFIGS.get(preset, preset)
        compiled[name] = qlower.compile(model, (token, position), quantize=config,
                                        calibration=calibration, backend="onnxruntime",
                                        backend_options=OrtOptions(threads=1, weight_only_compute=compute or "fp32"))
        clusters = [(c.backend, c.status) for c in compiled[name].report().clusters]
        print(f"{name}: compile {time.perf_counter() - start:.1f} s, clusters {clusters}", flush=True)
    times: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for name in names:
            for _ in range(3):
                compiled[name](token, position)
        for _ in range(blocks):
            for name in names:
                start = time.perf_counter()
                for _ in range(calls):
                    compiled[name](token, position)
                times[name].append((time.perf_counter() - start) / calls * 1000)
    for name in names:
        print(f"{name}: median {statistics.median(times[name]):.2f} ms/step, best block {min(times[name]):.2f} "
              f"({blocks} interleaved blocks of {calls})", flush=True)


def kernels(k: int = 576, n: int = 1536, calls: int = 200) -> None:
    """One [1, K] x [K, N] product on onnxruntime, one thread: fp32 MatMul, and MatMulNBits at 4
    and 8 bits with fp32 (accuracy_level 1) and int8 (4) compute (random codes; SmolLM2's MLP
    up-projection shape)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    a_info = helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, k])
    y_info = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, n])

    def model(nodes, inits, domains):
        m = helper.make_model(helper.make_graph(nodes, "g", [a_info], [y_info], inits),
                              opset_imports=[helper.make_opsetid(d, v) for d, v in domains])
        m.ir_version = 10
        return m.SerializeToString()

    def nbits(bits: int, level: int, block: int = 128) -> bytes:
        blocks = -(-k // block)
        inits = [numpy_helper.from_array(rng.integers(0, 255, (n, blocks, block * bits // 8), dtype=np.uint8), "B"),
                 numpy_helper.from_array((rng.random(n * blocks) * 0.01).astype(np.float32), "S"),
                 numpy_helper.from_array(rng.integers(0, 255, (n, -(-blocks * bits // 8)), dtype=np.uint8), "Z")]
        node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z"], ["Y"], domain="com.microsoft", K=k, N=n,
                                bits=bits, block_size=block, accuracy_level=level)
        return model([node], inits, [("", 21), ("com.microsoft", 1)])

    fp32 = model([helper.make_node("MatMul", ["A", "W"], ["Y"])],
                 [numpy_helper.from_array(rng.random((k, n), dtype=np.float32), "W")], [("", 21)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    a = rng.random((1, k), dtype=np.float32)
    for name, m in [("fp32 MatMul", fp32), ("4-bit, fp32 compute", nbits(4, 1)), ("4-bit, int8 compute", nbits(4, 4)),
                    ("8-bit, fp32 compute", nbits(8, 1)), ("8-bit, int8 compute", nbits(8, 4))]:
        session = ort.InferenceSession(m, options, providers=["CPUExecutionProvider"])
        for _ in range(20):
            session.run(None, {"A": a})
        best = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                session.run(None, {"A": a})
            best.append((time.perf_counter() - start) / calls * 1e6)
        print(f"{name:22s} {min(best):8.1f} us (best of 5 x {calls})", flush=True)


def iree_linear(k: int = 576, n: int = 1536, rows: tuple[int, ...] = (1, 128), runs: int = 20) -> None:
    """One [M, K] x [K, N] linear (SmolLM2's MLP up-projection shape) compiled by qlower for
    IREE, one thread: fp32, and 4-bit (groups of 32) and 8-bit (per channel) weight-only with
    each IreeOptions.weight_only_dequantize; the module's size and the call time, the float and
    weight-only modules timed in turn (timing.paired_latency_ms)."""
    import qlower
    from ..backends.iree import IreeOptions
    from ..backends.iree.runner import IreeCluster
    from ..timing import paired_latency_ms
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(k, n, bias=False).eval()
    schemes = {"4-bit g32": WeightOnly(4, 32, method="rtn"), "8-bit": WeightOnly(8, None, symmetric=True, method="rtn")}
    for m in rows:
        x = torch.randn(m, k)
        compiled = {"fp32": qlower.compile(model, (x,), backend="iree")}
        for name, scheme in schemes.items():
            for where in ("load", "call"):
                compiled[f"{name}, {where}"] = qlower.compile(
                    model, (x,), quantize=QuantConfig(weight_only=scheme), calibration=[(x,)], backend="iree",
                    backend_options=IreeOptions(weight_only_dequantize=where))
        with torch.no_grad():
            times = paired_latency_ms({name: (lambda cm=cm: cm(x)) for name, cm in compiled.items()}, runs=runs)
        for name, cm in compiled.items():
            (cluster,) = [c for c in cm._executable.module.modules() if isinstance(c, IreeCluster)]
            median, spread = times[name]
            print(f"M={m:4d} {name:18s} module {len(cluster.vmfb) / 1e6:6.2f} MB  {median:8.3f} ms "
                  f"(interquartile {spread:.3f})", flush=True)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    what, names = (argv[0] if argv else "accuracy"), argv[1:]
    if what == "accuracy":
        accuracy(names or list(CONFIGS))
    elif what == "engines":
        engines(tuple(names) or ("onnxruntime", "openvino"))
    elif what == "kernels":
        kernels()
    elif what == "speed":
        speed(names or ["int4-weight", "int8-weight", "transformer"])
    elif what == "iree":
        iree_linear()
    else:
        raise SystemExit(f"unknown measurement {what!r}: accuracy, engines, speed, kernels or iree")


if __name__ == "__main__":
    main()
