"""`qlower verify`: the float model and its quantized program side by side on the user's inputs.

What it measures (all on the same inputs):
- end to end: output SQNR / cosine / max |error| of the Q/DQ program (`qlower.quantize(...)`)
  against the float model;
- per layer (every conv/linear/matmul), against the float graph the quantizer starts from
  (BatchNorm folded, SmoothQuant / bias correction applied when the config has them):
  * `sqnr_db` / `cosine`: the layer's OWN error. Every op of the quantized graph runs on the
    float values of its inputs (teacher forcing), so what the layer hands on (its output, after
    a fused relu and the output's 8-bit rounding where the program has one) differs only by
    the rounding of its inputs, weights and output, not by the error earlier layers passed on.
    This ranks the table (worst first) and picks the layers to try in float;
  * `sqnr_db_in_model` / `cosine_in_model`: the same value in the quantized model as it runs
    (errors accumulated from earlier layers included);
  * activation statistics of the layer's (first) input and of its output in the float graph:
    range, max|x|, p99.9|x|, the largest channel maximum over the median channel maximum, and
    kurtosis; for conv/linear the weight's peak/median |w| (per output channel, the worst);
- suggestions, each MEASURED: the program is quantized again with the change (a layer's module
  in `QuantConfig.keep_float`, all helpful ones together, SmoothQuant on or off) and its end to
  end output SQNR is compared with the unchanged one's. Nothing is estimated.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.fx import GraphModule, Node

from ..quantize.config import QuantConfig, config_code
from .html import render
from ..core.metrics import cosine, energy_ratio_db, format_db, format_number, max_abs, sqnr_db
from ..capture import capture, check_example_inputs, check_module
from ..errors import InputError
from ..quantize import QlowerQuantizer, calibrate, rewrite_float, SmoothQuant, is_quantized, quantize as qlower_quantize
from ..quantize.calibrate import prepare_calibration
from ..quantize.quantizer import FUSABLE_ACTIVATIONS
from ..quantize.smoothquant import find_groups

aten = torch.ops.aten
# op -> index of the activation input whose statistics are reported
LAYER_OPS = {aten.conv1d.default: 0, aten.conv2d.default: 0, aten.linear.default: 0, aten.matmul.default: 0,
             aten.bmm.default: 0, aten.mm.default: 0, aten.addmm.default: 1}
_WEIGHTED = {aten.conv1d.default, aten.conv2d.default, aten.linear.default}
_CHANNEL_FIRST = {aten.conv1d.default, aten.conv2d.default}
_SAMPLE = 1 << 16          # |x| values kept per tensor and input for the p99.9 estimate


# ---------------------------------------------------------------- result types
@dataclass(frozen=True)
class Metrics:
    """Output of the quantized program against the float model."""
    sqnr_db: float
    cosine: float
    max_abs: float

    def __str__(self) -> str:
        return f"SQNR {format_db(self.sqnr_db)} dB, cosine {self.cosine:.5f}, max |err| {self.max_abs:.4g}"


@dataclass(frozen=True)
class ActivationStats:
    """One tensor of the float graph over all verify inputs. `channel_ratio`: largest per-channel
    max|x| over the median channel's (channels: last dim, dim 1 for convs); large values are the
    outlier channels SmoothQuant moves into the weights. `kurtosis`: 3 for a Gaussian."""
    shape: tuple[int, ...]
    min: float
    max: float
    absmax: float
    p999: float
    channel_ratio: float
    top_channel: int
    kurtosis: float

    @property
    def peak_over_p999(self) -> float:
        return self.absmax / self.p999 if self.p999 > 0 else math.inf


@dataclass(frozen=True)
class WeightStats:
    """`peak_to_median`: max|w| / median|w| of the worst output channel (whole tensor for
    per-tensor weights): int8 gives the median weight about 127 / peak_to_median levels."""
    absmax: float
    peak_to_median: float
    worst_channel: int


@dataclass(frozen=True)
class LayerReport:
    index: int                 # position in the graph (execution order)
    node: str                  # node name in the float graph
    op: str                    # aten op (linear, conv2d, matmul, ...)
    module: str                # nn.Module path ("" at the root): what keep_float takes
    quantized: bool            # False where the config keeps it float
    output_quantized: bool     # its output (after a fused relu) is rounded to 8 bits in the program
    sqnr_db: float             # own error: quantized op on the float inputs, incl. its output rounding
    cosine: float
    sqnr_db_in_model: float    # in the quantized model as it runs (accumulated error)
    cosine_in_model: float
    input: ActivationStats
    output: ActivationStats
    weight: WeightStats | None = None

    @property
    def name(self) -> str:
        return self.module or self.node

    def label(self, unique: bool = True) -> str:
        return self.name if unique and self.module else f"{self.module or '<root>'}:{self.node}"


@dataclass(frozen=True)
class Suggestion:
    """A change to the config and its measured effect on the end-to-end output."""
    action: str                      # "keep_float" | "smoothquant_on" | "smoothquant_off"
    description: str
    config: QuantConfig
    before: Metrics                  # the config as given
    after: Metrics                   # the config with this change
    recommended: bool
    modules: tuple[str, ...] = ()    # for keep_float: the modules added
    reason: str = ""

    @property
    def gain_db(self) -> float:
        if math.isinf(self.after.sqnr_db) and math.isinf(self.before.sqnr_db):
            return 0.0
        return self.after.sqnr_db - self.before.sqnr_db

    def code(self) -> str:
        """The QuantConfig to pass to get this result."""
        return config_code(self.config)


@dataclass
class VerifyReport:
    model: str
    config: QuantConfig
    config_name: str
    inputs: int                      # evaluation inputs
    calibration: int                 # calibration batches
    end_to_end: Metrics
    layers: list[LayerReport]        # worst own SQNR first
    suggestions: list[Suggestion]    # largest measured gain first
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    min_gain_db: float = 0.5         # a suggestion is recommended from this measured gain on

    @property
    def worst(self) -> LayerReport | None:
        return self.layers[0] if self.layers else None

    @property
    def stats(self) -> dict[str, ActivationStats]:
        """Input activation statistics per layer, in graph order."""
        return {layer.label(self._unique(layer)): layer.input
                for layer in sorted(self.layers, key=lambda layer: layer.index)}

    @property
    def recommended(self) -> list[Suggestion]:
        return [s for s in self.suggestions if s.recommended]

    def _unique(self, layer: LayerReport) -> bool:
        return sum(other.module == layer.module for other in self.layers) == 1

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["config"] = config_code(self.config)
        for s, d in zip(self.suggestions, out["suggestions"]):
            d["config"] = s.code()
            d["gain_db"] = s.gain_db
        return out

    def to_html(self) -> str:
        return render(self)

    def save_html(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)   # a report folder, like `qlower bench --out`
        path.write_text(self.to_html(), encoding="utf-8")
        return path

    def summary(self, top: int | None = None) -> str:
        lines = [f"qlower verify: {self.model}, config {self.config_name} ({config_code(self.config)})",
                 f"{self.inputs} evaluation inputs, {self.calibration} calibration batches, {self.seconds:.1f} s",
                 f"end to end (Q/DQ program vs float): {self.end_to_end}", ""]
        shown = self.layers if top is None else self.layers[:top]
        names = [layer.label(self._unique(layer)) + ("" if layer.quantized else " (float)") for layer in shown]
        width = min(max([len(n) for n in names] + [20]), 64)
        head = (f"{'layer (worst first)':{width}s} {'op':7s} {'SQNR':>6s} {'cosine':>8s} {'in model':>8s}   "
                f"{'in max|x|':>9s} {'p99.9':>8s} {'ch ratio':>8s} {'kurt':>6s} {'w pk/med':>8s}")
        lines += [head, "-" * len(head)]
        for layer, name in zip(shown, names):
            lines.append(f"{_clip(name, width):{width}s} {layer.op:7s} {format_db(layer.sqnr_db):>6s} "
                         f"{layer.cosine:8.5f} {format_db(layer.sqnr_db_in_model):>8s}   "
                         f"{format_number(layer.input.absmax):>9s} "
                         f"{format_number(layer.input.p999):>8s} {format_number(layer.input.channel_ratio):>8s} "
                         f"{format_number(layer.input.kurtosis):>6s} "
                         f"{format_number(layer.weight.peak_to_median) if layer.weight else '-':>8s}")
        if top is not None and len(self.layers) > top:
            lines.append(f"... {len(self.layers) - top} more layers in the HTML report")
        lines += ["", "SQNR: dB, the layer's own error (its quantized op on float inputs, output rounding "
                      "included); in model: the same value in the quantized model as it runs"]
        if self.suggestions:
            lines += ["", "suggestions (each measured: quantized again with the change, end-to-end output SQNR; "
                          f"recommended from +{self.min_gain_db:g} dB):"]
            for s in self.suggestions:
                mark = "recommended" if s.recommended else "not recommended"
                lines.append(f"  {s.description}: {format_db(s.before.sqnr_db)} -> {format_db(s.after.sqnr_db)} dB "
                             f"({s.gain_db:+.2f} dB)  {mark}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


# ---------------------------------------------------------------- entry point
def ranked_layers(model, example_inputs, calibration, config: QuantConfig) -> list[str]:
    """Module paths of the quantized conv/linear/matmul layers, most sensitive first: each
    layer's own output SQNR with float inputs, so a bad layer's error carried into later layers
    does not make them look bad too (what an accuracy target's mixed precision keeps float)."""
    report = verify(model, calibration, calibration, dataclasses.replace(config, target=None),
                    example_inputs=example_inputs, suggest=0, smoothquant=False)
    return list(dict.fromkeys(layer.module for layer in report.layers if layer.quantized and layer.module))


def verify(model, inputs, calibration=None, config: QuantConfig | str | None = "int8", *,
           example_inputs: tuple | None = None, dynamic_shapes=None, suggest: int = 3,
           smoothquant: bool = True, min_gain_db: float = 0.5, name: str | None = None,
           progress: Callable[[str], None] | None = None) -> VerifyReport:
    """Compare `model` (nn.Module or float ExportedProgram) with its quantized program on `inputs`
    (one input tuple or a list of them).

    calibration: input tuples for calibration (default: `inputs`, which flatters the result: a
        note says so). config: preset name or QuantConfig. suggest: how many of the worst layers'
        modules to try in float (0: none). smoothquant: also measure SmoothQuant on/off.
        min_gain_db: a suggestion is recommended when its measured gain is at least this."""

    start = time.perf_counter()
    say = progress or (lambda message: None)
    check_module(model)
    if isinstance(model, torch.export.ExportedProgram) and is_quantized(model):
        raise InputError("verify compares a float model with its quantization; this program is already quantized",
                         hint="pass the float model (or its float .pt2 program)")
    config_name = config if isinstance(config, str) else ("default" if config is None else "custom")
    config = QuantConfig.from_name(config) if isinstance(config, str) else (config or QuantConfig())
    inputs = _input_list(inputs)
    example_inputs = check_example_inputs(example_inputs if example_inputs is not None else inputs[0])
    notes: list[str] = []
    if calibration is None:
        calibration = inputs
        notes.append("calibrated on the evaluation inputs themselves (pass separate calibration data "
                     "for an unbiased measurement)")
    calibration = prepare_calibration(calibration, example_inputs)
    float_fn = model.module() if isinstance(model, torch.export.ExportedProgram) else model
    with torch.no_grad():
        refs = [float_fn(*x) for x in inputs]

    def end_to_end(cfg: QuantConfig) -> Metrics:
        qm = qlower_quantize(model, example_inputs, calibration, cfg, dynamic_shapes,
                             ranked_layers=ranked_layers).module()
        with torch.no_grad():
            outs = [qm(*x) for x in inputs]
        return Metrics(sqnr_db(refs, outs), cosine(refs, outs), max_abs(refs, outs))

    say("per-layer comparison")
    ep = capture(model, example_inputs, dynamic_shapes)
    layers, layer_e2e, groups = _per_layer(ep, calibration, config, inputs, find_groups)
    layers.sort(key=lambda layer: (layer.sqnr_db, layer.index))
    say("quantizing")
    base = end_to_end(config)
    if abs(_finite(layer_e2e) - _finite(base.sqnr_db)) > 0.05:
        notes.append(f"the per-layer run's output SQNR ({format_db(layer_e2e)} dB) differs from the Q/DQ "
                     f"program's ({format_db(base.sqnr_db)} dB)")

    suggestions: list[Suggestion] = []
    unique_modules = {}
    for layer in layers:
        if layer.module and layer.quantized and layer.module not in unique_modules \
                and not any(layer.module == k or layer.module.startswith(k + ".") for k in config.keep_float):
            unique_modules[layer.module] = layer
    candidates = list(unique_modules.values())[:max(suggest, 0)]
    for i, layer in enumerate(candidates):
        say(f"measuring: {layer.module} in float ({i + 1}/{len(candidates)})")
        cfg = dataclasses.replace(config, keep_float=config.keep_float + (layer.module,))
        after = end_to_end(cfg)
        ops = [other for other in layers if other.module == layer.module or other.module.startswith(layer.module + ".")]
        what = f"{len(ops)} {'ops' if len(ops) > 1 else 'op'}: " + ", ".join(sorted({other.op for other in ops}))
        suggestions.append(Suggestion("keep_float", f"keep {layer.module} in float ({what})", cfg, base, after,
                                      after.sqnr_db - base.sqnr_db >= min_gain_db, (layer.module,),
                                      f"own SQNR {format_db(layer.sqnr_db)} dB, rank {layers.index(layer) + 1} "
                                      f"of {len(layers)}"))
    helpful = [s for s in suggestions if s.recommended]
    chosen = [m for s in helpful for m in s.modules]
    modules = tuple(m for m in chosen if not any(m != k and m.startswith(k + ".") for k in chosen))
    if len(modules) > 1:
        say(f"measuring: {len(modules)} modules in float together")
        cfg = dataclasses.replace(config, keep_float=config.keep_float + modules)
        after = end_to_end(cfg)
        suggestions.append(Suggestion("keep_float", f"keep {', '.join(modules)} in float together", cfg, base,
                                      after, after.sqnr_db - base.sqnr_db >= min_gain_db, modules,
                                      "every single-module suggestion that helped, combined"))
    if smoothquant and groups:
        on = config.smoothquant is not None
        say("measuring: SmoothQuant " + ("off" if on else "on"))
        cfg = dataclasses.replace(config, smoothquant=None if on else SmoothQuant())
        after = end_to_end(cfg)
        worst = max((layer for layer in layers if layer.op == "linear"), key=lambda layer: layer.input.channel_ratio,
                    default=None)
        reason = f"{groups} norm->linear group{'s' if groups > 1 else ''} it can smooth"
        if worst is not None:
            reason += (f"; largest linear-input channel ratio {format_number(worst.input.channel_ratio)} "
                       f"({worst.label(sum(layer.module == worst.module for layer in layers) == 1)})")
        if on:
            desc = "turn SmoothQuant off (it is on in this config)"
        else:
            desc = "turn SmoothQuant on"
        suggestions.append(Suggestion("smoothquant_off" if on else "smoothquant_on", desc, cfg, base, after,
                                      after.sqnr_db - base.sqnr_db >= min_gain_db, (), reason))
    elif smoothquant:
        notes.append("SmoothQuant does not apply: no activation feeds only linears from a foldable "
                     "producer (a norm or a gated MLP's up-projection)")
    suggestions.sort(key=lambda s: -_finite(s.gain_db))
    notes.append("per-layer numbers compare with the float graph the quantizer starts from (BatchNorm "
                 "folded; SmoothQuant's rescaling and bias correction applied when on); end-to-end "
                 "numbers compare the Q/DQ program's outputs with the model's own")
    return VerifyReport(name or type(model).__name__, config, config_name, len(inputs), len(calibration), base,
                        layers, suggestions, notes, time.perf_counter() - start, min_gain_db)


# ---------------------------------------------------------------- per layer
def _per_layer(ep: torch.export.ExportedProgram, calibration: list, config, inputs: list, find_groups):
    """LayerReports (unsorted), the quantized graph's own output SQNR, and the number of
    SmoothQuant groups of the float graph."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.utils import _fuse_conv_bn_, _fuse_linear_bn_


    gm = ep.module()
    groups = len(find_groups(gm))
    rewrite_float(gm, calibration, config)
    _fuse_conv_bn_(gm)   # what prepare_pt2e does first: the float graph the quantizer sees
    _fuse_linear_bn_(gm)
    with warnings.catch_warnings():  # torch's pytree deprecation noise from copying the graph
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        reference = copy.deepcopy(gm)
    observed = prepare_pt2e(gm, QlowerQuantizer(config))
    calibrate(observed, calibration)
    quantized = convert_pt2e(observed, fold_quantize=True)

    layer_nodes = [n for n in reference.graph.nodes if n.op == "call_function" and n.target in LAYER_OPS]
    qnodes = {n.name: n for n in quantized.graph.nodes if n.op == "call_function"}
    layer_nodes = [n for n in layer_nodes if n.name in qnodes and qnodes[n.name].target is n.target]
    ref_names = {n.name for n in reference.graph.nodes}
    chains = {n.name: _output_chain(qnodes[n.name], ref_names) for n in layer_nodes}
    acc = {n.name: _LayerAcc(n, qnodes[n.name], reference, config, bool(chains[n.name])) for n in layer_nodes}
    keep = {n.name for n in layer_nodes} | {c[-1].name for c in chains.values() if c}
    ref_outs, q_outs = [], []
    with torch.no_grad():
        for x in inputs:
            flat = tuple(torch.utils._pytree.tree_leaves(x))
            ref = _Run(reference)
            ref_out = ref.run(*flat)
            values = {n.name: (n.target, v) for n, v in ref.env.items() if n.op == "call_function"}
            free = _Run(quantized, keep=keep)
            q_out = free.run(*flat)
            forced = _Run(quantized, keep=keep, force=values)
            forced.run(*flat)
            for n in layer_nodes:
                chain = chains[n.name]
                if chain:  # compare what the layer hands on: its output after the graph's rounding
                    compared = chain[0].name if len(chain) == 3 else n.name  # a fused relu's output, or the op's
                    acc[n.name].add(ref.env, values[n.name][1], values[compared][1], free.kept[chain[-1].name],
                                    _evaluate(chain, forced.kept[n.name]))
                else:
                    acc[n.name].add(ref.env, values[n.name][1], values[n.name][1], free.kept[n.name],
                                    forced.kept[n.name])
            ref_outs.append(ref_out)
            q_outs.append(q_out)
    return [a.result() for a in acc.values()], sqnr_db(ref_outs, q_outs), groups


def _is_qdq(node, prefix: str) -> bool:
    return node.op == "call_function" and str(node.target).startswith("quantized_decomposed." + prefix)


def _output_chain(qnode: Node, ref_names: set[str]) -> list[Node]:
    """[fused activation,] quantize, dequantize: how the quantized graph rounds the layer's output
    (empty where it stays float). The activation must exist in the float graph too."""
    chain, node = [], qnode
    users = list(node.users)
    if len(users) == 1 and users[0].target in FUSABLE_ACTIVATIONS and users[0].name in ref_names:
        node = users[0]
        chain.append(node)
        users = list(node.users)
    quants = [u for u in users if _is_qdq(u, "quantize_per_tensor")]
    if len(quants) != 1:
        return []
    deqs = [u for u in quants[0].users if _is_qdq(u, "dequantize_per_tensor")]
    if not deqs:
        return []
    chain += [quants[0], deqs[0]]
    previous = qnode
    for link in chain:  # evaluable from the layer's value alone (literal qparams)
        if any(isinstance(a, Node) and a is not previous for a in list(link.args) + list(link.kwargs.values())):
            return []
        previous = link
    return chain


def _evaluate(chain: list[Node], value: torch.Tensor) -> torch.Tensor:
    for link in chain:
        value = link.target(*(value if isinstance(a, Node) else a for a in link.args), **link.kwargs)
    return value


class _Run(torch.fx.Interpreter):
    """Runs a graph keeping every value (`env`), or only the named ones (`kept`); with `force`,
    every op whose name and target match a float-graph op continues with the float value
    (teacher forcing: each op then sees float inputs, quantized where the graph quantizes)."""

    def __init__(self, gm: GraphModule, keep: set[str] | None = None, force: dict | None = None):
        super().__init__(gm, garbage_collect_values=keep is not None)
        self.keep, self.force, self.kept = keep, force, {}

    def run_node(self, n: Node):
        out = super().run_node(n)
        if self.keep is not None and n.name in self.keep:
            self.kept[n.name] = out
        if self.force is not None and n.op == "call_function" and n.name in self.force:
            target, value = self.force[n.name]
            if target is n.target and isinstance(out, torch.Tensor) and isinstance(value, torch.Tensor) \
                    and value.shape == out.shape and value.dtype == out.dtype:
                return value
        return out


class _LayerAcc:
    def __init__(self, node: Node, qnode: Node, gm: GraphModule, config, output_quantized: bool):
        self.node, self.gm, self.config, self.output_quantized = node, gm, config, output_quantized
        self.index = list(gm.graph.nodes).index(node)
        self.quantized = any(isinstance(a, Node) and "dequantize" in str(a.target) for a in qnode.args)
        axis = 1 if node.target in _CHANNEL_FIRST else -1
        self.inp, self.out = _TensorAcc(axis), _TensorAcc(axis)
        self.own, self.model = _PairAcc(), _PairAcc()
        self.weight: WeightStats | None = None

    def add(self, env: dict, out: torch.Tensor, ref: torch.Tensor, free: torch.Tensor, forced: torch.Tensor) -> None:
        """out: the op's float output; ref: the float value compared with free (the quantized model
        as it runs) and forced (the quantized op on float inputs)."""
        arg = self.node.args[LAYER_OPS[self.node.target]]
        if isinstance(arg, Node) and isinstance(env.get(arg), torch.Tensor):
            self.inp.add(env[arg])
        self.out.add(out)
        self.own.add(ref, forced)
        self.model.add(ref, free)
        if self.weight is None and self.node.target in _WEIGHTED and isinstance(self.node.args[1], Node):
            w = env.get(self.node.args[1])
            if isinstance(w, torch.Tensor) and w.is_floating_point():
                self.weight = _weight_stats(w, self.config.per_channel)

    def result(self) -> LayerReport:
        stack = self.node.meta.get("nn_module_stack") or {}
        module = str(list(stack.values())[-1][0]) if stack else ""
        op = getattr(self.node.target, "overloadpacket", self.node.target).__name__
        return LayerReport(self.index, self.node.name, op, module, self.quantized, self.output_quantized,
                           self.own.sqnr(), self.own.cosine(), self.model.sqnr(), self.model.cosine(),
                           self.inp.result(), self.out.result(), self.weight)


class _PairAcc:
    """SQNR and cosine of (reference, test) pairs accumulated over inputs."""

    def __init__(self):
        self.signal = self.noise = self.dot = self.tt = 0.0

    def add(self, ref: torch.Tensor, test: torch.Tensor) -> None:
        r, t = ref.detach().double().reshape(-1), test.detach().double().reshape(-1)
        self.signal += float(r @ r)
        self.noise += float((r - t) @ (r - t))
        self.dot += float(r @ t)
        self.tt += float(t @ t)

    def sqnr(self) -> float:
        return energy_ratio_db(self.signal, self.noise)

    def cosine(self) -> float:
        denom = math.sqrt(self.signal * self.tt)
        return self.dot / denom if denom > 0 else (1.0 if self.noise == 0 else 0.0)


class _TensorAcc:
    """Range, per-channel maxima, shifted moments (kurtosis) and a random sample of |x| (p99.9)."""

    def __init__(self, axis: int):
        self.axis = axis
        self.n = 0
        self.shift: float | None = None
        self.moments = [0.0] * 4
        self.lo, self.hi = math.inf, -math.inf
        self.channels: torch.Tensor | None = None
        self.samples: list[torch.Tensor] = []
        self.shape: tuple[int, ...] = ()
        self.gen = torch.Generator().manual_seed(0)

    def add(self, x: torch.Tensor) -> None:
        if not x.is_floating_point() or x.numel() == 0:
            return
        x = x.detach()
        self.shape = tuple(x.shape)
        y = x.double().reshape(-1)
        if self.shift is None:
            self.shift = float(y.mean())
        y = y - self.shift
        p = y.clone()
        for k in range(4):
            self.moments[k] += float(p.sum())
            if k < 3:
                p *= y
        self.n += y.numel()
        self.lo, self.hi = min(self.lo, float(x.min())), max(self.hi, float(x.max()))
        axis = self.axis % x.dim() if x.dim() else 0
        per_channel = x.abs().movedim(axis, 0).reshape(x.shape[axis], -1).amax(dim=1).float() if x.dim() \
            else x.abs().reshape(1).float()
        if self.channels is None or self.channels.shape != per_channel.shape:
            self.channels = per_channel
        else:
            self.channels = torch.maximum(self.channels, per_channel)
        flat = x.abs().reshape(-1).float()
        if flat.numel() > _SAMPLE:
            flat = flat[torch.randint(0, flat.numel(), (_SAMPLE,), generator=self.gen)]
        self.samples.append(flat)

    def result(self) -> ActivationStats:
        if self.n == 0:
            return ActivationStats(self.shape, 0.0, 0.0, 0.0, 0.0, 1.0, 0, 0.0)
        m1, m2, m3, m4 = (s / self.n for s in self.moments)
        var = m2 - m1 * m1
        central4 = m4 - 4 * m1 * m3 + 6 * m1 * m1 * m2 - 3 * m1 ** 4
        kurt = central4 / (var * var) if var > 0 else 0.0
        sample = torch.cat(self.samples)
        k = max(1, min(sample.numel(), math.ceil(0.999 * sample.numel())))
        p999 = float(sample.kthvalue(k).values)
        med = float(self.channels.median())
        top = float(self.channels.max())
        ratio = top / med if med > 0 else (1.0 if top == 0 else math.inf)
        return ActivationStats(self.shape, self.lo, self.hi, max(abs(self.lo), abs(self.hi)), p999, ratio,
                               int(self.channels.argmax()), kurt)


def _weight_stats(w: torch.Tensor, per_channel: bool) -> WeightStats:
    rows = w.detach().abs().float().reshape(w.shape[0], -1) if per_channel else w.detach().abs().float().reshape(1, -1)
    peak = rows.amax(dim=1)
    med = rows.median(dim=1).values
    ratio = torch.where(med > 0, peak / med.clamp_min(1e-30), torch.where(peak > 0, torch.inf, 1.0))
    return WeightStats(float(peak.max()), float(ratio.max()), int(ratio.argmax()) if per_channel else -1)


# ---------------------------------------------------------------- helpers
def _input_list(inputs) -> list[tuple]:
    if isinstance(inputs, torch.Tensor):
        return [(inputs,)]
    if isinstance(inputs, tuple) and all(isinstance(t, torch.Tensor) for t in inputs):
        return [inputs]
    out = [x if isinstance(x, tuple) else (x,) if isinstance(x, torch.Tensor) else tuple(x) for x in inputs]
    if not out:
        from ..errors import InputError
        raise InputError("verify needs at least one input", hint="pass inputs=[(x1,), (x2,), ...]")
    return out


def _finite(value: float) -> float:
    return value if math.isfinite(value) else (1e9 if value > 0 else -1e9)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1):]


__all__: Sequence[str] = ["verify", "VerifyReport", "LayerReport", "ActivationStats", "WeightStats", "Suggestion",
                          "Metrics"]
