"""What an exported ONNX file carries in its metadata (`metadata_props`): the operator set, the
numerics it computes, and how far ONNX consumers are from qlower's own output on it, measured at
export on the model's example inputs:

- `qlower.onnx_ops`: "standard" (ai.onnx operators only) or "onnxruntime" (contrib kernels);
- `qlower.numerics`: the numerics profile the file carries, defined in words;
- `qlower.max_abs_diff.onnxruntime` / `.openvino`: max |consumer - qlower| over every output
  element, on plain `onnxruntime.InferenceSession` (CPU) and OpenVINO's CPU plugin
  (`read_model` + `compile_model`, INFERENCE_PRECISION_HINT f32) where installed;
  `qlower.max_abs_diff.<consumer>.quanta`: the same in units of the output's quantization step
  where every output is dequantized from integers (else absent);
- `qlower.measured_on`: the input shapes of that measurement.

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
FLOAT_NUMERICS = "float model: every op rounded by the consumer's float kernels"


def describe(model: onnx.ModelProto, cm, onnx_ops: str) -> dict[str, str]:
    """Write the metadata above into `model` (replacing qlower's keys); returns it."""
    report = cm.report()
    meta = {"qlower.version": __version__, "qlower.onnx_ops": onnx_ops,
            "qlower.compiled_for": report.backend,
            "qlower.numerics": NUMERICS[onnx_ops].format(profile=report.profile) if report.quantized
            else FLOAT_NUMERICS}
    examples = cm._examples()
    meta["qlower.measured_on"] = "example inputs " + ", ".join(
        f"{name}{list(t.shape)}" for name, t in zip((i.name for i in model.graph.input), _leaves(examples)))
    want = [t.detach().numpy() for t in _leaves(cm(*examples))]
    quanta = output_quanta(cm.graph_module)
    feed = {i.name: t.numpy() for i, t in zip(model.graph.input, _leaves(examples))}
    payload = model.SerializeToString()
    consumers = {"onnxruntime": _run_onnxruntime}
    if onnx_ops == "standard" and importlib.util.find_spec("openvino") is not None:
        consumers["openvino"] = _run_openvino
    for name, run in consumers.items():
        try:
            got = run(payload, feed)
        except Exception as exc:  # noqa: BLE001  (a consumer refusing the file is a result, recorded)
            meta[f"qlower.max_abs_diff.{name}"] = f"failed: {str(exc).splitlines()[0][:200] if str(exc) else exc!r}"
            continue
        diffs = [_max_abs_diff(g, w) for g, w in zip(got, want)]
        meta[f"qlower.max_abs_diff.{name}"] = repr(max(diffs, default=0.0))
        if quanta is not None:
            meta[f"qlower.max_abs_diff.{name}.quanta"] = repr(max((d / q for d, q in zip(diffs, quanta)), default=0.0))
    keep = [p for p in model.metadata_props if not p.key.startswith("qlower.")]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in keep}, **meta})
    return meta


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


def _run_onnxruntime(payload: bytes, feed: dict) -> list[np.ndarray]:
    import onnxruntime as ort
    session = ort.InferenceSession(payload, providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def _run_openvino(payload: bytes, feed: dict) -> list[np.ndarray]:
    import openvino as ov
    core = ov.Core()
    compiled = core.compile_model(core.read_model(model=payload, weights=b""), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32"})
    result = compiled(feed)
    return [np.asarray(result[port]) for port in compiled.outputs]
