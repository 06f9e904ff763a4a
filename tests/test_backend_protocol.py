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


def test_unit_step_slices_pass_contract():
    """iree's legalization pass: positive (x[:, 0:1:2], one element), near misses (x[:, 0:3:2]
    takes two; a step-1 slice), idempotent, values unchanged."""
    from qlower.passes.iree.unit_step_single_element_slices import UnitStepSingleElementSlices
    from qlower.passes import PassManager

    class Slices(torch.nn.Module):
        def forward(self, a, b):
            return a[:, 0:1:2], b[:, 0:3:2], b[:, 1:2], b[:, 1:3:2], b[:, -2::5]
    a, b = torch.randn(1, 1, 10), torch.randn(1, 3, 10)
    gm = torch.export.export(Slices(), (a, b)).module()
    want = gm(a, b)
    ctx = PassManager([UnitStepSingleElementSlices()]).run(gm, PassContext())
    steps = [n.args[4] if len(n.args) > 4 else 1 for n in gm.graph.nodes
             if n.op == "call_function" and n.target is torch.ops.aten.slice.Tensor]
    # positives: one element with an end past it (1:3:2 is element 1; -2::5 is element 1)
    assert sorted(steps) == [1, 1, 1, 1, 2] and sum(ctx.rewrites.values()) == 3
    assert not UnitStepSingleElementSlices().run(gm, PassContext())          # idempotent
    got = gm(a, b)
    assert all(torch.equal(w, g) for w, g in zip(want, got))


def test_outer_products_pass_contract():
    """iree's legalization pass: positives (matmul, mm, linear with and without bias, addmm with a
    reduction size of 1), near misses (a reduction of 2; a 1-D operand; an integer product),
    idempotent, values unchanged (bit-exact without a bias: one product either way)."""
    from qlower.passes.iree.outer_products_as_mul import OuterProductsAsMul
    from qlower.passes import PassManager

    class Products(torch.nn.Module):
        def forward(self, x, w, b, v, i):
            return (x[:, 2:3] @ w, torch.mm(x[:, :1], w), torch.nn.functional.linear(x[:, 3:4], w.t()),
                    torch.nn.functional.linear(x[:, 3:4], w.t(), b), torch.addmm(b, x[:, 5:6], w),
                    x[:, :2] @ v, x[0, 2:3] @ w, i[:, :1] @ i[:1])
    args = (torch.randn(4, 12), torch.randn(1, 5), torch.randn(5), torch.randn(2, 5), torch.randint(-5, 5, (3, 3)))
    gm = torch.export.export(Products(), args).module()
    want = gm(*args)
    ctx = PassManager([OuterProductsAsMul()]).run(gm, PassContext())
    assert sum(ctx.rewrites.values()) == 5
    left = [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "matmul" in str(n.target)]
    assert len(left) == 3, left   # the K = 2 product, the 1-D operand, the integer product
    assert not OuterProductsAsMul().run(gm, PassContext())          # idempotent
    got = gm(*args)
    assert all(torch.equal(w, g) for w, g in zip(want[:3] + want[5:], got[:3] + got[5:]))
    assert all(torch.allclose(w, g, rtol=1e-6, atol=1e-6) for w, g in zip(want[3:5], got[3:5]))   # + bias


def test_drop_noop_ceil_mode_pass_contract():
    """iree's legalization pass: positive (8x8, k2 s2: no partial window), near miss (7x7: ceil
    mode adds a window, kept), idempotent, values unchanged."""
    from qlower.passes.iree.drop_noop_ceil_mode import DropNoopCeilMode
    from qlower.passes import PassManager

    class Pools(torch.nn.Module):
        def forward(self, a, b):
            return (torch.nn.functional.max_pool2d(a, 2, 2, ceil_mode=True),
                    torch.nn.functional.max_pool2d(b, 2, 2, ceil_mode=True))
    a, b = torch.randn(1, 2, 8, 8), torch.randn(1, 2, 7, 7)
    gm = torch.export.export(Pools(), (a, b)).module()
    want = gm(a, b)
    ctx = PassManager([DropNoopCeilMode()]).run(gm, PassContext())
    modes = [n.args[5] if len(n.args) > 5 else n.kwargs.get("ceil_mode") for n in gm.graph.nodes
             if n.op == "call_function" and "max_pool2d" in str(n.target)]
    assert modes == [False, True] and sum(ctx.rewrites.values()) == 1
    assert not DropNoopCeilMode().run(gm, PassContext())          # idempotent
    got = gm(a, b)
    assert all(torch.equal(w, g) for w, g in zip(want, got))
