"""What an exported ONNX file carries in its metadata (`metadata_props`): the operator set, the
numerics it computes, and how far ONNX consumers are from qlower's own output on it, measured at
export on the model's example inputs:

- `qlower.onnx_ops`: "standard" (ai.onnx operators only), "qdq" (the same, in Q/DQ form) or
  "onnxruntime" (contrib kernels);
- `qlower.numerics`: the numerics profile the file carries, defined in words;
- `qlower.max_abs_diff.onnxruntime` / `.openvino`: max |consumer - qlower| over every output
  element, on a plain `onnxruntime.InferenceSession` (CPU) with the graph optimizers named in
  `qlower.onnxruntime.disabled_optimizers` turned off (`disabled_optimizers=`; the default
  session's float-op fusions round their own way: `.onnxruntime.default_session` is measured
  too, for information) and on OpenVINO's CPU plugin
  (`read_model` + `compile_model`, INFERENCE_PRECISION_HINT f32) where installed, over the
  example inputs and SHUFFLES permutations of their float values;
  `qlower.max_abs_diff.<consumer>.quanta`: the same in units of the output's quantization step
  where every output is dequantized from integers (else absent);
- `qlower.output_quanta`: each output's quantization step, where every output is dequantized
  from integers;
- `qlower.tolerance.<consumer>`: the deviation declared for that consumer (`tolerance`), in
  output quanta where those are known;
- `qlower.measured_on`: the inputs of that measurement.

A consumer that cannot read or run the file is recorded as such (`failed: ...`), not hidden."""
from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import torch

from ..core.version import __version__

NUMERICS = {
    "standard": ("qlower canonical integer program (profile {profile!r}) in standard ONNX: integer ops as "
                 "ConvInteger / MatMulInteger / QuantizeLinear / DequantizeLinear / Gather tables define them, "
                 "requantization as an fp32 multiply rounded half to even; bit-exact where a consumer computes "
                 "those ops as ONNX defines them, float ops rounded by the consumer's float kernels"),
    "qdq": ("qlower quantized program (profile {profile!r}) in Q/DQ form: QuantizeLinear / DequantizeLinear around "
            "float ops, which a consumer fuses into its own int8 kernels with its own rounding (not canonical)"),
    "onnxruntime": ("qlower canonical integer program (profile {profile!r}) with ONNX Runtime contrib kernels "
                    "proven exact on the exporting CPU: bit-exact with qlower on ONNX Runtime"),
}
SHUFFLES = 3   # inputs measured besides the example
FLOAT_ULPS = 16   # the least float-output deviation declared (ulps of the largest output)
FLOAT_NUMERICS = "float model: every op rounded by the consumer's float kernels"


def describe(model: onnx.ModelProto, cm, onnx_ops: str, disabled_optimizers: tuple[str, ...]) -> dict[str, str]:
    """Write the metadata above into `model` (replacing qlower's keys); returns it.
    `disabled_optimizers`: the ONNX Runtime graph optimizers the declared bound assumes off (the
    onnxruntime backend's: its float-op fusions round their own way, its QDQ re-fusions are not
    canonical)."""
    report = cm.report()
    meta = {"qlower.version": __version__, "qlower.onnx_ops": onnx_ops,
            "qlower.compiled_for": report.backend,
            "qlower.numerics": NUMERICS[onnx_ops].format(profile=report.profile) if report.quantized
            else FLOAT_NUMERICS}
    examples = cm._examples()
    calls = [examples] + [_shuffled(examples, seed) for seed in range(SHUFFLES)]
    grown = _grown(examples, cm.input_specs)
    if grown is not None:
        try:
            cm(*grown)
            calls.append(grown)
        except Exception:  # noqa: BLE001  (inputs the model refuses are not measured)
            grown = None

    def shapes(args) -> str:
        names = (i.name for i in model.graph.input)
        return ", ".join(f"{name}{list(t.shape)}" for name, t in zip(names, _leaves(args)))
    meta["qlower.measured_on"] = (
        f"the example inputs ({shapes(examples)}), {SHUFFLES} shuffles of their float values"
        + (f" and the example tiled along its dynamic dims ({shapes(grown)})" if grown else ""))
    wants = [[t.detach().numpy() for t in _leaves(cm(*args))] for args in calls]
    largest = max((float(np.abs(w).max()) for want in wants for w in want
                   if w.size and np.issubdtype(w.dtype, np.floating) and np.isfinite(w).all()), default=0.0)
    quanta = output_quanta(cm.graph_module)
    if quanta is not None:
        meta["qlower.output_quanta"] = ",".join(repr(q) for q in quanta)
    feeds = [{i.name: t.numpy() for i, t in zip(model.graph.input, _leaves(args))} for args in calls]
    payload = model.SerializeToString()
    meta["qlower.onnxruntime.disabled_optimizers"] = ",".join(disabled_optimizers)
    consumers = {"onnxruntime": lambda payload, feeds: _run_onnxruntime(payload, feeds, disabled_optimizers),
                 "onnxruntime.default_session": _run_onnxruntime}
    if onnx_ops != "onnxruntime" and importlib.util.find_spec("openvino") is not None:
        consumers["openvino"] = _run_openvino
    for name, run in consumers.items():
        try:
            gots = run(payload, feeds)
        except Exception as exc:  # noqa: BLE001  (a consumer refusing the file is a result, recorded)
            meta[f"qlower.max_abs_diff.{name}"] = f"failed: {str(exc).splitlines()[0][:200] if str(exc) else exc!r}"
            continue
        diffs = [max(_max_abs_diff(got[k], want[k]) for got, want in zip(gots, wants)) for k in range(len(wants[0]))]
        measured = max(diffs, default=0.0)
        meta[f"qlower.max_abs_diff.{name}"] = repr(measured)
        in_quanta = None
        if quanta is not None:
            in_quanta = max((d / q for d, q in zip(diffs, quanta)), default=0.0)
            meta[f"qlower.max_abs_diff.{name}.quanta"] = repr(in_quanta)
        if name != "onnxruntime.default_session":   # measured for information only
            meta[f"qlower.tolerance.{name}"] = tolerance(name, measured, in_quanta, largest, onnx_ops)
    keep = [p for p in model.metadata_props if not p.key.startswith("qlower.")]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in keep}, **meta})
    return meta


def tolerance(consumer: str, measured: float, in_quanta: float | None, largest: float = 0.0,
              onnx_ops: str = "standard") -> str:
    """The declared deviation of `consumer` from qlower, per output element, as "<number>
    <unit> (why)"; the unit is "output quanta" where every output is dequantized from integers
    (`qlower.output_quanta`), else "abs".

    ONNX Runtime computes the standard integer ops as ONNX defines them, so for an integer
    program (quantized outputs) it declares the measured number of quanta as a bound (0:
    bit-exact); float outputs are rounded by its float kernels in their own order: the larger of
    the measured difference and FLOAT_ULPS fp32 ulps of the largest output. OpenVINO quantizes
    by multiplying with fp32(1/scale) and divides inexactly (docs/openvino.md): a value within
    an ulp of a rounding tie can land one step off and carry through later layers, so it
    declares no bound, only what was measured ("measured", `declared_tolerance` bound False); so
    does every consumer of the Q/DQ form (`onnx_ops="qdq"`), which runs on its own int8 kernels."""
    what = f"{round(in_quanta)} output quanta" if in_quanta is not None else f"{measured!r} abs"
    if onnx_ops == "qdq":
        return f"{what} (measured, not a bound: the Q/DQ form runs on the consumer's own int8 kernels and rounding)"
    if consumer != "onnxruntime":
        return (f"{what} (measured, not a bound: {consumer} rounds a value within an ulp of a quantization tie "
                "either way)")
    if in_quanta is not None:
        return f"{round(in_quanta)} output quanta (bound: ONNX Runtime computes the integer ops as ONNX defines them)"
    floor = FLOAT_ULPS * float(np.spacing(np.float32(largest)))
    return (f"{max(measured, floor)!r} abs (bound: the larger of the measured max abs diff {measured!r} and "
            f"{FLOAT_ULPS} fp32 ulps of the largest output; float ops are rounded by the consumer's kernels)")


def declared_tolerance(model: onnx.ModelProto, consumer: str) -> tuple[float, str, bool] | None:
    """(number, "quanta" | "abs", whether it is declared as a bound) from an exported model's
    metadata for `consumer`."""
    value = read(model).get(f"qlower.tolerance.{consumer}")
    if value is None:
        return None
    words = value.split()
    return float(words[0]), "quanta" if words[1:3] == ["output", "quanta"] else "abs", "(bound:" in value


def output_quanta_of(model: onnx.ModelProto) -> list[float] | None:
    value = read(model).get("qlower.output_quanta")
    return None if value is None else [float(v) for v in value.split(",")]


def read(model: onnx.ModelProto) -> dict[str, str]:
    """qlower's metadata of an exported model."""
    return {p.key: p.value for p in model.metadata_props if p.key.startswith("qlower.")}


def _leaves(tree) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _max_abs_diff(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    if got.dtype == np.bool_ or want.dtype == np.bool_:
        return float((got != want).sum())
    g, w = got.astype(np.float64), want.astype(np.float64)
    same = (g == w) | (np.isnan(g) & np.isnan(w))
    return 0.0 if same.all() else float(np.nanmax(np.where(same, 0.0, np.abs(g - w))))


def output_quanta(gm: torch.fx.GraphModule) -> list[float] | None:
    """Per flat output, the scale of the per-tensor dequantize that produces it; None unless
    every output is one."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    quanta = []
    for node in out if isinstance(out, (tuple, list)) else (out,):
        target = getattr(node, "target", None)
        if getattr(target, "namespace", None) != "qlower" or "dequantize" != target._schema.name.split("::")[-1]:
            return None
        scale = node.args[1]
        scale = _constant(gm, scale) if isinstance(scale, torch.fx.Node) else scale
        if scale is None or torch.as_tensor(scale).numel() != 1:
            return None
        quanta.append(float(torch.as_tensor(scale)))
    return quanta


def _constant(gm: torch.fx.GraphModule, node: torch.fx.Node):
    if node.op != "get_attr":
        return None
    value = gm
    for part in str(node.target).split("."):
        value = getattr(value, part, None)
    return value


def _shuffled(args: tuple, seed: int) -> tuple:
    """`args` with every float tensor's values permuted (same values, other positions: inputs
    like the example without inventing a distribution); integer inputs (token ids, masks) kept."""
    gen = torch.Generator().manual_seed(seed)

    def shuffle(t):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() < 2:
            return t
        return t.reshape(-1)[torch.randperm(t.numel(), generator=gen)].reshape(t.shape)
    return torch.utils._pytree.tree_map(shuffle, args)


GROWTH = 4   # a dynamic dim of the example is tiled up to this many times its size (within its declared range)


def _grown(args: tuple, specs) -> tuple | None:
    """The example tiled along each dynamic dim, up to GROWTH times its size within the declared
    range (larger reductions and more elements than the example: where float rounding and
    near-tie roundings show); None when nothing can grow."""
    leaves, spec = torch.utils._pytree.tree_flatten(args)
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    if len(tensors) != len(specs):
        return None
    out, grew = [], False
    for t, s in zip(tensors, specs):
        for axis, want in enumerate(s.shape):
            bounds = s.bounds[axis] if s.bounds else None
            if want is not None or bounds is None or t.shape[axis] == 0:
                continue
            size = GROWTH * t.shape[axis] if bounds[1] is None else min(bounds[1], GROWTH * t.shape[axis])
            if size > t.shape[axis]:
                reps = [1] * t.dim()
                reps[axis] = -(-size // t.shape[axis])
                t = t.repeat(*reps).narrow(axis, 0, size)
                grew = True
        out.append(t)
    if not grew:
        return None
    it = iter(out)
    return torch.utils._pytree.tree_unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in leaves], spec)


def _run_onnxruntime(payload: bytes, feeds: list[dict], disabled: tuple[str, ...] = ()) -> list[list[np.ndarray]]:
    import onnxruntime as ort
    session = ort.InferenceSession(payload, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled))
    return [session.run(None, feed) for feed in feeds]


def _run_openvino(payload: bytes, feeds: list[dict]) -> list[list[np.ndarray]]:
    import openvino as ov
    core = ov.Core()
    compiled = core.compile_model(core.read_model(model=payload, weights=b""), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32"})
    results = [compiled(feed) for feed in feeds]
    return [[np.asarray(result[port]) for port in compiled.outputs] for result in results]
