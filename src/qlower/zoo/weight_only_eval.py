"""SmolLM2-135M with weight-only quantization: the measurements of docs/llm.md.

    python -m qlower.zoo.weight_only_eval accuracy [name ...]   # perplexity / top-1, reference backend
    python -m qlower.zoo.weight_only_eval nncf "awq+se g128" ...  # the peer: NNCF compress_weights
    python -m qlower.zoo.weight_only_eval grid                   # Q4_1's own g32 grid, eager
    python -m qlower.zoo.weight_only_eval ties                   # int8 flips vs fp32's near ties, eager
    python -m qlower.zoo.weight_only_eval engines                # onnxruntime / openvino vs reference
    python -m qlower.zoo.weight_only_eval speed [name ...]       # decode step, onnxruntime / llama.cpp, 1 thread
    python -m qlower.zoo.weight_only_eval kernels [K N]          # one MatMulNBits per compute type
    python -m qlower.zoo.weight_only_eval profile [name]         # where a decode step's time goes
    python -m qlower.zoo.weight_only_eval iree-linear            # one weight-only linear on IREE
"""
from __future__ import annotations

import functools
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
    "int4 g128 awq, no clip": QuantConfig(weight_only=WeightOnly(4, 128, method="awq", awq_clip=False)),
    "int4 g128 awq (int4-weight)": "int4-weight",
    "int4 g128 awq+gptq": QuantConfig(weight_only=WeightOnly(4, 128, method="awq+gptq")),
    "int4 g64 rtn": QuantConfig(weight_only=WeightOnly(4, 64, method="rtn")),
    "int4 g64 gptq": QuantConfig(weight_only=WeightOnly(4, 64, method="gptq")),
    "int4 g64 awq, no clip": QuantConfig(weight_only=WeightOnly(4, 64, method="awq", awq_clip=False)),
    "int4 g64 awq": QuantConfig(weight_only=WeightOnly(4, 64, method="awq")),
    "int4 g32 rtn": QuantConfig(weight_only=WeightOnly(4, 32, method="rtn")),
    "int4 g32 gptq": QuantConfig(weight_only=WeightOnly(4, 32, method="gptq")),
    "int4 g32 awq": QuantConfig(weight_only=WeightOnly(4, 32, method="awq")),
    # the tied embedding / lm_head table: float, 8-bit per row, or 4-bit in the linears' groups
    "int4 g128 awq, table float": QuantConfig(weight_only=WeightOnly(4, 128, method="awq")),
    "int4 g128 awq, table 8-bit": QuantConfig(weight_only=WeightOnly(4, 128, method="awq", embeddings=True,
                                                                      embedding_bits=8)),
    "int4 g128 awq, table 4-bit": QuantConfig(weight_only=WeightOnly(4, 128, method="awq", embeddings=True)),
    "int8-weight, table float": QuantConfig(weight_only=WeightOnly(8, None, symmetric=True)),
    "int8-weight, table 8-bit": QuantConfig(weight_only=WeightOnly(8, None, symmetric=True, embeddings=True)),
}


def texts() -> tuple[torch.Tensor, torch.Tensor]:
    """(held-out text: every paragraph after the first [1, 1076], whole text [1, 1279]) token ids."""
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
                          dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=len(smollm2.TOKEN_IDS))},))


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


# NNCF's torch backend has no GPTQ (ParameterNotSupportedError): AWQ and scale estimation
NNCF_OPTIONS = {"rtn": {}, "awq+se": dict(awq=True, scale_estimation=True)}


def nncf_peer(names: list[str]) -> None:
    """NNCF's `compress_weights` (torch backend, INT4_ASYM, every linear 4-bit, the embedding and
    tied lm_head float as in qlower) on the same model, held-out text and calibration windows.
    Names "<options> g<group>", options from NNCF_OPTIONS (e.g. "awq+se g128"). NNCF has no
    shorter last group: where the group size does not divide a layer's inputs (SmolLM2's 576 at
    128) it uses a divisor (64) there."""
    import copy

    import nncf
    from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode
    torch.set_num_threads(1)
    base = smollm2.build_prefill()
    held, _ = texts()
    calibration = [w[0] for w in smollm2.calibration_windows()]
    with torch.no_grad():
        ref = base(held)
    p0 = perplexity(ref, held)
    print(f"{'fp32':30s} ppl {p0:.3f}", flush=True)
    for name in names:
        options, _, group = name.partition(" g")
        start = time.perf_counter()
        model = nncf.compress_weights(
            copy.deepcopy(base), mode=nncf.CompressWeightsMode.INT4_ASYM, ratio=1.0, group_size=int(group),
            backup_mode=nncf.BackupMode.NONE, dataset=nncf.Dataset(calibration),   # the torch backend traces with it
            advanced_parameters=AdvancedCompressionParameters(group_size_fallback_mode=GroupSizeFallbackMode.ADJUST),
            **NNCF_OPTIONS[options])
        seconds = time.perf_counter() - start
        with torch.no_grad():
            got = model(held)
        p = perplexity(got, held)
        top = (got.argmax(-1) == ref.argmax(-1)).double().mean().item()
        print(f"{'NNCF ' + name:30s} ppl {p:.3f} ({100 * (p / p0 - 1):+.2f}%)  top-1 {100 * top:.1f}%  "
              f"compress {seconds:.0f} s", flush=True)


def native_grid() -> None:
    """Eager check of the weights' own format (GGUF Q4_1: groups of 32, w = u·s + min with a
    float min, s = (max − min) / 15): re-quantizing every linear but the tied lm_head in that form
    returns the same weights and logits; and how many weights qlower's g32 asymmetric round to
    nearest (an integer zero point) moves."""
    from ..quantize.awq import fake_quant
    torch.set_num_threads(1)
    lm = smollm2.load_lm()
    held, _ = texts()
    linears = {n: m for n, m in lm.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    with torch.no_grad():
        ref = lm(input_ids=held, use_cache=False).logits
        moved = total = 0
        for m in linears.values():
            w = m.weight.detach()
            rtn = fake_quant(w, WeightOnly(4, 32, symmetric=False))
            moved += int(((rtn - w).abs() > 1e-6 * w.abs().max()).sum())
            total += w.numel()
            g = w.reshape(w.shape[0], -1, 32)
            lo, step = g.amin(-1, keepdim=True), (g.amax(-1, keepdim=True) - g.amin(-1, keepdim=True)) / 15
            m.weight = torch.nn.Parameter((torch.round((g - lo) / torch.where(step > 0, step, 1)) * step + lo)
                                          .reshape(w.shape), requires_grad=False)
        got = lm(input_ids=held, use_cache=False).logits
    print(f"Q4_1 form (g32, float min): logits max |diff| {(got - ref).abs().max().item():.3g}, ppl "
          f"{perplexity(got, held):.3f} (fp32 {perplexity(ref, held):.3f}); qlower g32 asymmetric RTN moves "
          f"{moved} of {total} weights ({100 * moved / total:.1f}%)", flush=True)


def _fake_int8(w: torch.Tensor, group: int | None) -> torch.Tensor:
    """Plain-PyTorch symmetric int8 (s = max|w| / 127 per output channel or per group of
    `group` inputs, round half to even): independent of qlower's numerics on purpose."""
    g = w.reshape(w.shape[0], -1, group or w.shape[1])
    s = g.abs().amax(-1, keepdim=True) / 127
    return (torch.round(g / s) * s).reshape(w.shape)


def ties() -> None:
    """Eager: every linear but the tied lm_head fake-quantized (int8 per channel, in groups of 64
    and 32, and fp16), perplexity and top-1 vs fp32 on the held-out text; for per-channel int8,
    fp32's top-2 logit gap at the positions whose next token changed."""
    torch.set_num_threads(1)
    lm = smollm2.load_lm()
    held, _ = texts()
    linears = {n: m for n, m in lm.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    weights = {n: m.weight.detach() for n, m in linears.items()}
    variants = {"int8 per channel": lambda w: _fake_int8(w, None), "int8 g64": lambda w: _fake_int8(w, 64),
                "int8 g32": lambda w: _fake_int8(w, 32), "fp16": lambda w: w.half().float()}
    with torch.no_grad():
        ref = lm(input_ids=held, use_cache=False).logits
        top2 = ref[0].topk(2, -1).values
        gap = top2[:, 0] - top2[:, 1]
        for name, fake in variants.items():
            for n, m in linears.items():
                m.weight = torch.nn.Parameter(fake(weights[n]), requires_grad=False)
            got = lm(input_ids=held, use_cache=False).logits
            flip = ref[0].argmax(-1) != got[0].argmax(-1)
            p, p0 = perplexity(got, held), perplexity(ref, held)
            agree = 100 * (1 - flip.double().mean().item())
            print(f"{name:18s} ppl {p:.3f} ({100 * (p / p0 - 1):+.2f}%)  top-1 {agree:.2f}% "
                  f"({int(flip.sum())} of {flip.numel()} flipped)", flush=True)
            if name == "int8 per channel":
                for t in (0.1, 0.25, 0.5):
                    keep = gap >= t
                    print(f"  fp32 top-2 gap < {t}: {int((gap < t).sum())} positions, {int((gap[flip] < t).sum())} "
                          f"of the flipped; top-1 where gap >= {t}: "
                          f"{100 * (1 - flip[keep].double().mean().item()):.2f}% of {int(keep.sum())}", flush=True)


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
    """Logits of the second paragraph (182 tokens: smollm2.SECOND_END), each engine vs the
    reference backend on one program (the engines' kernels do not depend on how the codes were
    chosen: round to nearest)."""
    torch.set_num_threads(1)
    model = smollm2.build_prefill()
    held = texts()[0][:, :smollm2.SECOND_END - smollm2.SPLIT]
    for config in configs:
        want = compile_prefill(model, CONFIGS[config])(held)
        for backend in backends:
            got = compile_prefill(model, CONFIGS[config], backend)(held)
            diff = (got - want).abs()
            print(f"{config} {backend}: {int((diff > 0).sum())} of {diff.numel()} logits differ, max abs "
                  f"{diff.max().item():.3g} (logits up to {want.abs().max().item():.3g}), max {ulps(got, want)} ulps "
                  f"where |logit| >= 1; "
                  f"top-1 equal at {100 * (got.argmax(-1) == want.argmax(-1)).double().mean().item():.1f}%", flush=True)


def _decode_inputs():
    """(decode step module, its inputs: one token at slot 0, calibration steps)."""
    from .realsuite import smollm2_decode
    model = smollm2_decode(1).eval()
    token = smollm2.TextWindows(seq=1, stride=1).batch(1, 0)
    position = torch.zeros(1, dtype=torch.int64)
    calibration = [(smollm2.TextWindows(seq=1, stride=1).batch(1, i), torch.tensor([i])) for i in range(8)]
    return model, (token, position), calibration


def compile_decode(name: str, model, example, calibration):
    """`name` ("fp32", a preset or a row of CONFIGS, "+int8" for weight_only_compute="int8")
    compiled for onnxruntime with one thread."""
    import qlower
    from ..backends.onnxruntime import OrtOptions
    preset, _, compute = name.partition("+")
    config = None if preset == "fp32" else CONFIGS.get(preset, preset)
    return qlower.compile(model, example, quantize=config, calibration=calibration, backend="onnxruntime",
                          backend_options=OrtOptions(threads=1, weight_only_compute=compute or "fp32"))


def _llama_cpp_step(position: int = 64):
    """One llama.cpp decode step (llama-cpp-python, one thread) on the GGUF file the weights come
    from, at cache position `position` (the text before it evaluated once, a token at a time:
    batched evaluation faults in some llama.cpp CPU builds, bench/llm.py)."""
    from llama_cpp import Llama
    llm = Llama(model_path=str(smollm2.gguf_path()), n_ctx=128, n_batch=1, n_ubatch=1, n_threads=1,
                n_threads_batch=1, verbose=False)
    ids = list(smollm2.TOKEN_IDS[:position + 1])
    llm.eval(ids[:position])

    def step():
        llm.n_tokens = position   # eval drops the cache past n_tokens: the same step every call
        llm.eval(ids[position:])
    return step


def speed(names: list[str], blocks: int = 8, calls: int = 16) -> None:
    """Decode step (128-slot KV cache, batch 1) on onnxruntime with one thread, interleaved
    blocks; the name "llama.cpp" times llama.cpp on the bundled GGUF file in the same blocks."""
    from collections import Counter
    torch.set_num_threads(1)
    model, (token, position), calibration = _decode_inputs()
    steps = {}
    for name in names:
        start = time.perf_counter()
        if name == "llama.cpp":
            steps[name] = _llama_cpp_step()
            print(f"{name}: loaded in {time.perf_counter() - start:.1f} s", flush=True)
            continue
        cm = compile_decode(name, model, (token, position), calibration)
        steps[name] = functools.partial(cm, token, position)
        clusters = Counter(f"{c.backend} {c.status}" for c in cm.report().clusters)
        print(f"{name}: compile {time.perf_counter() - start:.1f} s, clusters {dict(clusters)}", flush=True)
    times: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for name in names:
            for _ in range(3):
                steps[name]()
        for _ in range(blocks):
            for name in names:
                start = time.perf_counter()
                for _ in range(calls):
                    steps[name]()
                times[name].append((time.perf_counter() - start) / calls * 1000)
    for name in names:
        print(f"{name}: median {statistics.median(times[name]):.2f} ms/step, best block {min(times[name]):.2f} "
              f"({blocks} interleaved blocks of {calls})", flush=True)


def _node_times(fused, args, calls: int) -> dict[str, float]:
    """ms per call of the executable's graph nodes by kind: engine clusters, the module-state
    write-backs (FunctionalizeState's final copy_), other PyTorch ops, and the rest (get_attr,
    getitem: Python only)."""
    from ..passes.functionalize_state import WRITE_BACK
    totals: dict[str, float] = {}

    class Timed(torch.fx.Interpreter):
        def run_node(self, n):
            start = time.perf_counter()
            out = super().run_node(n)
            kind = ("engine" if n.op == "call_module" and str(n.target).startswith("cluster_") else
                    "state write-back" if n.meta.get(WRITE_BACK) else
                    "other PyTorch ops" if n.op == "call_function" and n.target.__module__ != "_operator" else
                    "graph plumbing")
            totals[kind] = totals.get(kind, 0.0) + time.perf_counter() - start
            return out
    with torch.no_grad():
        for _ in range(calls):
            Timed(fused).run(*args)
    return {k: v / calls * 1000 for k, v in totals.items()}


def _ort_profile(onnx_bytes: bytes, feed: dict, calls: int, vocab: int) -> dict[str, float]:
    """ms per call per kind of node (the product whose output is `vocab` wide: lm_head), from
    ONNX Runtime's own profiler on a session of the cluster's model with qlower's session
    options (one thread)."""
    import json
    import os
    import tempfile
    import onnxruntime as ort
    from ..backends.onnxruntime import OrtOptions, _inference_session
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    session = _inference_session(ort, onnx_bytes, so, OrtOptions().disabled_optimizers)
    for _ in range(calls):
        session.run(None, feed)
    with open(session.end_profiling()) as f:
        events = json.load(f)
    totals: dict[str, float] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        op = e["args"]["op_name"]
        shapes = json.dumps(e["args"].get("output_type_shape", ""))
        kind = f"lm_head ({op})" if f"{vocab}]" in shapes and ("MatMul" in op or op == "Gemm") else op
        totals[kind] = totals.get(kind, 0.0) + e["dur"] / 1000
    return {k: v / calls for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def profile(names: list[str], calls: int = 64) -> None:
    """Where one decode step's time goes (SmolLM2-135M, 128-slot KV cache, batch 1, onnxruntime,
    one thread): the whole call; the executable's graph node by node (engine, state
    write-backs, other PyTorch ops); within the engine call, the session's run alone (inputs
    already numpy) against its feed and output conversion; ONNX Runtime's own per-node profile
    of that run (lm_head separately)."""
    import statistics as stats
    from ..backends.clusters import as_numpy
    from ..passes.functionalize_state import WRITE_BACK
    from ..backends.onnxruntime import OrtCluster
    torch.set_num_threads(1)
    model, example, calibration = _decode_inputs()
    for name in names:
        cm = compile_decode(name, model, example, calibration)
        fused = cm._executable.module
        clusters = [m for m in fused.children() if isinstance(m, OrtCluster)]
        with torch.no_grad():
            for _ in range(8):
                cm(*example)
            whole = []
            for _ in range(8):
                start = time.perf_counter()
                for _ in range(calls // 8):
                    cm(*example)
                whole.append((time.perf_counter() - start) / (calls // 8) * 1000)
        nodes = _node_times(fused, example, calls)
        cluster = max(clusters, key=lambda c: c.info.ops)
        # the cluster's runtime inputs as the graph passes them: run the graph up to the call
        seen = {}

        class Grab(torch.fx.Interpreter):
            def call_module(self, target, args, kwargs):
                if getattr(fused, target) is cluster:
                    seen["args"] = args
                return super().call_module(target, args, kwargs)
        with torch.no_grad():
            Grab(fused).run(*example)
        feed = {n: as_numpy(a) for n, a in zip(cluster.input_names, seen["args"])}
        run = []
        for _ in range(8):
            start = time.perf_counter()
            for _ in range(calls // 8):
                cluster._run(cluster.output_names, feed, None)
            run.append((time.perf_counter() - start) / (calls // 8) * 1000)
        writes = sum(1 for n in fused.graph.nodes if n.meta.get(WRITE_BACK))
        print(f"{name}: whole call {stats.median(whole):.2f} ms (median of 8 x {calls // 8}); "
              f"{len(clusters)} engine cluster(s), {writes} state write-backs, "
              f"{len(cluster.input_names)} session inputs, {len(cluster.output_names)} outputs", flush=True)
        for kind, ms in sorted(nodes.items(), key=lambda kv: -kv[1]):
            print(f"  graph nodes, {kind:20s} {ms:7.2f} ms", flush=True)
        print(f"  session run alone (numpy feed)  {stats.median(run):7.2f} ms", flush=True)
        vocab = cm(*example).shape[-1]
        for kind, ms in _ort_profile(cluster.info.onnx, feed, calls, vocab).items():
            if ms >= 0.05:
                print(f"    ORT {kind:28s} {ms:7.2f} ms", flush=True)


def kernels(k: int = 576, n: int = 1536) -> None:
    """One [1, K] x [K, N] product on onnxruntime, one thread: fp32 MatMul, and MatMulNBits at 4
    and 8 bits with fp32 (accuracy_level 1) and int8 (4) compute (random codes; default shape:
    SmolLM2's MLP up-projection)."""
    calls = max(10, 200 * 1536 // n)   # 200 at the default shape; the same work at larger ones
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
    elif what == "ties":
        ties()
    elif what == "grid":
        native_grid()
    elif what == "nncf":
        nncf_peer(names or ["rtn g128", "awq+se g128"])
    elif what == "engines":
        engines(tuple(names) or ("onnxruntime", "openvino"))
    elif what == "profile":
        profile(names or ["int4-weight"])
    elif what == "kernels":
        kernels(*map(int, names))   # [K N]: default SmolLM2's MLP up-projection; 576 49152: its lm_head
    elif what == "speed":
        speed(names or ["int4-weight", "int8-weight", "transformer"])
    elif what == "iree-linear":
        iree_linear()
    else:
        raise SystemExit(f"unknown measurement {what!r}: accuracy, nncf, grid, ties, engines, speed, profile, kernels "
                         "or iree-linear")


if __name__ == "__main__":
    main()
