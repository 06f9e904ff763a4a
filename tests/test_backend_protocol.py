"""The backend protocol (backends/base.py): what every backend declares, how legalization runs
(`compile_graph`: the backend's passes on its own copy, before `compile`), and that nothing
outside backends/ decides by a backend's name."""
from __future__ import annotations

import re
from pathlib import Path

import torch
from torch.fx import GraphModule

import qlower
from qlower.backends import EXPORT_FORMATS, backend_names, get_backend
from qlower.backends.base import Executable, compile_graph
from qlower.errors import PassError
from qlower.passes import Pass, PassContext
from qlower.report import ClusterInfo

SRC = Path(qlower.__file__).parent


class _Relu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1


def _graph() -> GraphModule:
    return torch.export.export(_Relu(), (torch.randn(2, 3),)).module()


class _ReluToClamp(Pass):
    """Toy legalization: relu -> clamp_min(0) (same values)."""
    name = "relu_to_clamp"

    def run(self, gm, ctx: PassContext) -> bool:
        changed = False
        for node in gm.graph.nodes:
            if node.target is torch.ops.aten.relu.default:
                node.target = torch.ops.aten.clamp_min.default
                node.args = (node.args[0], 0.0)
                ctx.rewrites["relu as clamp_min"] += 1
                changed = True
        return changed


class _ToyBackend:
    """A third-party backend in the protocol's minimal form plus one legalization pass."""
    name = "toy"

    def __init__(self, passes):
        self.passes, self.seen = passes, None

    def legalize_passes(self):
        return list(self.passes)

    def compile(self, gm):
        self.seen = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        return Executable(run=gm, clusters=[ClusterInfo(0, self.name, len(self.seen), {})], module=gm)


def test_compile_graph_legalizes_a_copy_then_compiles_and_reports_the_rewrites():
    gm = _graph()
    before = str(gm.graph)
    backend = _ToyBackend([_ReluToClamp()])
    exe = compile_graph(backend, gm)
    assert "aten.clamp_min.default" in backend.seen and "aten.relu.default" not in backend.seen
    assert exe.notes[0] == "relu as clamp_min x1"
    assert str(gm.graph) == before                     # the caller's program is untouched
    x = torch.randn(2, 3)
    assert torch.equal(exe.run(x), gm(x))


def test_compile_graph_without_legalization_passes_compiles_the_graph_as_is():
    class Bare(_ToyBackend):
        legalize_passes = None
    backend = Bare([])
    del Bare.legalize_passes                           # a backend that does not define the hook
    exe = compile_graph(backend, _graph())
    assert backend.seen == ["aten.relu.default", "aten.add.Tensor"] and exe.notes == []


def test_a_legalization_pass_that_breaks_the_graph_is_a_pass_error_naming_it():
    class Broken(Pass):
        name = "drops_meta"

        def run(self, gm, ctx):
            for node in gm.graph.nodes:
                if node.op == "call_function":
                    node.meta.pop("val", None)
            return True
    try:
        compile_graph(_ToyBackend([Broken()]), _graph())
    except PassError as exc:
        assert "drops_meta" in str(exc)
    else:
        raise AssertionError("a legalization pass that drops meta['val'] was accepted")


def test_every_backend_declares_the_protocol():
    for name in backend_names():
        backend = get_backend(name)
        assert backend.name == name and backend.capability is not None
        assert isinstance(backend.available(), bool)
        passes = getattr(backend, "legalize_passes", lambda: [])()
        assert all(isinstance(p, Pass) for p in passes), (name, passes)
        for hook in ("quant_config", "adjust_observers", "pipeline", "export"):
            assert getattr(backend, hook, None) is None or callable(getattr(backend, hook))


def test_export_formats_belong_to_the_backend_that_writes_them():
    assert EXPORT_FORMATS == {"onnx": "onnxruntime", "mlir": "iree", "vmfb": "iree"}
    for fmt, name in EXPORT_FORMATS.items():
        assert callable(get_backend(name).export), fmt


def test_onnxruntime_legalization_runs_through_compile_and_is_reported():
    """The int8 CNN's requantizing convs are fused by FuseRequantize, one of onnxruntime's
    legalization passes, and the report says so."""
    from qlower.zoo import ZOO
    entry = ZOO["cnn"]
    cm = qlower.compile(entry.model(), entry.inputs(1), quantize="int8", calibration=entry.calibration(2),
                        backend="onnxruntime")
    fused = [n for n in cm.report().notes if re.fullmatch(r"conv2d \+ requantize -> conv_requant\.default x\d+", n)]
    assert fused, cm.report().notes


def test_no_backend_name_is_compared_outside_backends():
    """api/cli/runtime ask the backend (hooks, EXPORT_FORMATS); they never branch on its name."""
    names = "|".join(backend_names())
    compare = re.compile(rf'(==|!=)\s*"({names})"|"({names})"\s*(==|!=)|\bin\s*\(\s*"({names})"')
    offenders = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        # bench stacks name their engines by design; engine choice measures named candidates against
        # the reference backend
        if rel.parts[0] in ("backends", "bench") or rel.name == "engine_choice.py":
            continue
        offenders += [f"{rel}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1) if compare.search(line)]
    assert not offenders, offenders
