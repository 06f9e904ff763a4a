"""What an exported ONNX file carries in its metadata (`metadata_props`): the operator set, the
numerics it computes, and how far ONNX consumers are from qlower's own output on it, measured at
export on the model's example inputs:

- `qlower.onnx_ops`: "standard" (ai.onnx operators only) or "onnxruntime" (contrib kernels);
- `qlower.numerics`: the numerics profile the file carries, defined in words;
- `qlower.max_abs_diff.onnxruntime` / `.openvino`: max |consumer - qlower| over every output
  element, on plain `onnxruntime.InferenceSession` (CPU) and OpenVINO's CPU plugin
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
    "onnxruntime": ("qlower canonical integer program (profile {profile!r}) with ONNX Runtime contrib kernels "
                    "proven exact on the exporting CPU: bit-exact with qlower on ONNX Runtime"),
}
SHUFFLES = 3   # inputs measured besides the example
FLOAT_NUMERICS = "float model: every op rounded by the consumer's float kernels"


def describe(model: onnx.ModelProto, cm, onnx_ops: str) -> dict[str, str]:
    """Write the metadata above into `model` (replacing qlower's keys); returns it."""
    report = cm.report()
    meta = {"qlower.version": __version__, "qlower.onnx_ops": onnx_ops,
            "qlower.compiled_for": report.backend,
            "qlower.numerics": NUMERICS[onnx_ops].format(profile=report.profile) if report.quantized
            else FLOAT_NUMERICS}
    examples = cm._examples()
    calls = [examples] + [_shuffled(examples, seed) for seed in range(SHUFFLES)]
    meta["qlower.measured_on"] = (f"the example inputs and {SHUFFLES} shuffles of their float values: " + ", ".join(
        f"{name}{list(t.shape)}" for name, t in zip((i.name for i in model.graph.input), _leaves(examples))))
    wants = [[t.detach().numpy() for t in _leaves(cm(*args))] for args in calls]
    quanta = output_quanta(cm.graph_module)
    if quanta is not None:
        meta["qlower.output_quanta"] = ",".join(repr(q) for q in quanta)
    feeds = [{i.name: t.numpy() for i, t in zip(model.graph.input, _leaves(args))} for args in calls]
    payload = model.SerializeToString()
    consumers = {"onnxruntime": _run_onnxruntime}
    if onnx_ops == "standard" and importlib.util.find_spec("openvino") is not None:
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
        meta[f"qlower.tolerance.{name}"] = tolerance(name, measured, in_quanta)
    keep = [p for p in model.metadata_props if not p.key.startswith("qlower.")]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in keep}, **meta})
    return meta


def tolerance(consumer: str, measured: float, in_quanta: float | None) -> str:
    """The declared max |consumer - qlower| per output element: "<k> output quanta (why)" where
    every output is dequantized from integers (`qlower.output_quanta`), else "<x> (why)" in the
    output's units. ONNX Runtime computes the standard integer ops as ONNX defines them, so its
    declared deviation is the measured one (0 for an integer program). OpenVINO quantizes by
    multiplying with fp32(1/scale) and divides inexactly (docs/openvino.md), so a value within an
    ulp of a rounding tie can land one step off: with quantized outputs at least one output
    quantum is declared, even where the measurement saw none."""
    if in_quanta is None:
        return f"{measured!r} (measured max abs diff)"
    steps = round(in_quanta)
    if consumer == "openvino":
        return (f"{max(steps, 1)} output quanta (OpenVINO rounds a value within an ulp of a quantization tie "
                f"either way; measured {steps})")
    return f"{steps} output quanta (measured)"


def declared_tolerance(model: onnx.ModelProto, consumer: str) -> tuple[float, str] | None:
    """(number, "quanta" | "abs") declared in an exported model's metadata for `consumer`."""
    value = read(model).get(f"qlower.tolerance.{consumer}")
    if value is None:
        return None
    return float(value.split()[0]), "quanta" if value.split()[1:3] == ["output", "quanta"] else "abs"


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


def _run_onnxruntime(payload: bytes, feeds: list[dict]) -> list[list[np.ndarray]]:
    import onnxruntime as ort
    session = ort.InferenceSession(payload, providers=["CPUExecutionProvider"])
    return [session.run(None, feed) for feed in feeds]


def _run_openvino(payload: bytes, feeds: list[dict]) -> list[list[np.ndarray]]:
    import openvino as ov
    core = ov.Core()
    compiled = core.compile_model(core.read_model(model=payload, weights=b""), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32"})
    results = [compiled(feed) for feed in feeds]
    return [[np.asarray(result[port]) for port in compiled.outputs] for result in results]
