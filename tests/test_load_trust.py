"""A file handed to qlower.load / load_pt2 / `qlower inspect` is untrusted data (docs/trust.md,
"What a loaded file may contain"): it never chooses code, operators with side effects, compiler
flags or paths, and it cannot cost minutes or gigabytes.

Each attack is crafted as its author would: from a real saved model, parts rewritten and the
manifest recomputed the way the loader checks it (anyone who can write the file can). Each test
names what the attack aims at (a marker file, time, memory) and asserts a quick ArtifactError
naming the node, field or part."""
import json
import os
import resource
import time
import tracemalloc
import zipfile

import pytest
import torch
from conftest import ENGINES, calib

import qlower
from qlower.errors import ArtifactError
from qlower import artifact
from qlower.artifact import allowlist, limits
from qlower.runtime import saved_options

HAS_IREE = "iree" in ENGINES


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


def _tiny():
    torch.manual_seed(0)
    return Tiny().eval(), torch.randn(2, 8)


def _saved(tmp_path, backend="onnxruntime", quantize=None, name="m.pt2", **kw):
    model, x = _tiny()
    extra = {"quantize": quantize, "calibration": calib((2, 8))} if quantize else {}
    cm = qlower.compile(model, (x,), backend=backend, **extra, **kw)
    return cm.save(tmp_path / name), cm, x


def _parts(path) -> dict[str, bytes]:
    return artifact._records(path.read_bytes(), path)


def _write(path, parts: dict[str, bytes], *, fix_manifest=True, deflated=(), streams=None):
    """Write `parts` as a .pt2 zip (root folder: the file's stem, as torch writes it), the
    manifest's sha256 recomputed unless fix_manifest is False. `deflated` names parts written
    deflated; `streams` maps a part name to (chunk, count): written deflated, chunk by chunk (a
    bomb without holding it in memory), listed in the manifest with `streams_sha256`."""
    parts = dict(parts)
    streams = streams or {}
    if fix_manifest and artifact.MANIFEST in parts:
        manifest = json.loads(parts[artifact.MANIFEST])
        manifest["parts"] = {n: artifact._sha256(d) for n, d in parts.items()
                             if n != artifact.MANIFEST and n not in artifact._WRITER_RECORDS}
        for name, (chunk, count) in streams.items():
            manifest["parts"][name] = _stream_sha256(chunk, count)
        parts[artifact.MANIFEST] = json.dumps(manifest).encode()
    root = path.stem
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in parts.items():
            method = zipfile.ZIP_DEFLATED if name in deflated else zipfile.ZIP_STORED
            zf.writestr(zipfile.ZipInfo(f"{root}/{name}"), data, compress_type=method)
        for name, (chunk, count) in streams.items():
            info = zipfile.ZipInfo(f"{root}/{name}")
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=True) as f:
                for _ in range(count):
                    f.write(chunk)
    return path


def _stream_sha256(chunk: bytes, count: int) -> str:
    import hashlib
    h = hashlib.sha256()
    for _ in range(count):
        h.update(chunk)
    return h.hexdigest()


def _meta(parts) -> dict:
    return json.loads(parts["extra/qlower.json"])


class _Cost:
    """Wall time, Python allocations and the process's peak RSS across a block."""

    def __enter__(self):
        tracemalloc.start()
        self.rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.python_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        self.rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.rss0
        return False


def _refused_quickly(load, path, match, *, seconds=1.0, memory=None):
    """load(path) raises an ArtifactError matching `match` within `seconds`, allocating at most
    `memory` bytes (default: 4x the file + 8 MiB) in Python and growing the peak RSS by no more
    (plus the imports' slack)."""
    memory = memory if memory is not None else 4 * path.stat().st_size + (8 << 20)
    with _Cost() as cost, pytest.raises(ArtifactError, match=match) as info:
        load(path)
    assert cost.seconds < seconds, f"refused after {cost.seconds:.2f} s"
    assert cost.python_peak < memory, f"{cost.python_peak >> 20} MiB allocated"
    # peak RSS: the first load of a session also imports backends (~70 MiB), hence the slack
    assert cost.rss_growth < memory + (128 << 20), f"peak RSS grew {cost.rss_growth >> 20} MiB"
    assert info.value.hint
    return info.value


def test_an_unchanged_rewrite_still_loads(tmp_path):
    """The tests' writer (zipfile, manifest recomputed) makes files the loader accepts: each
    refusal below is the attack's, not the rewriting's."""
    path, cm, x = _saved(tmp_path)
    parts = _parts(path)
    _write(path, parts, deflated={"models/model.json", "extra/qlower.json"})
    assert torch.equal(qlower.load(path)(x), cm(x))


# ---------------------------------------------------------------- 1: backend options

EVIL_FLAG = "--iree-llvmcpu-embedded-linker-path=touch {marker};"


def _as_iree_artifact(path, fields):
    """An onnxruntime artifact relabelled as compiled for IREE with these options (the author
    needs no IREE to write it)."""
    parts = _parts(path)
    meta = _meta(parts)
    meta["report"]["backend"] = "iree"
    meta["backend_options"] = {"class": "IreeOptions", "fields": fields}
    parts["extra/qlower.json"] = json.dumps(meta).encode()
    return _write(path, parts)


@pytest.mark.skipif(not HAS_IREE, reason="iree not installed")
def test_compiler_flags_from_a_file_never_reach_iree(tmp_path):
    """Attack 1: IreeOptions.extra_flags came from the file and went to iree-compile, which hands
    the embedded linker path to a shell: load and `qlower inspect` ran the author's command."""
    from typer.testing import CliRunner

    from qlower.cli import app
    marker = tmp_path / "pwned"
    path, _, _ = _saved(tmp_path)
    _as_iree_artifact(path, {"extra_flags": [EVIL_FLAG.format(marker=marker)]})
    err = _refused_quickly(qlower.load, path, "IreeOptions.extra_flags")
    assert "never taken from a file" in str(err) and "extra/qlower.json" in str(err)
    assert "backend_options=" in err.hint
    result = CliRunner().invoke(app, ["inspect", str(path)])
    assert "linear" in result.output   # inspect falls back to the program alone
    assert not marker.exists()


@pytest.mark.parametrize("field,value,match", [
    ("target_cpu", "host --iree-llvmcpu-embedded-linker-path=sh", "target_cpu"),
    ("target_cpu", "host\n", "target_cpu"),
    ("driver", "local-task --flag", "driver"),
    ("target_backend", "llvm-cpu;sh", "target_backend"),
    ("data_tiling", "yes", "data_tiling"),
    ("min_cluster_size", True, "min_cluster_size"),
    ("min_cluster_size", 1 << 40, "min_cluster_size"),
    ("ukernels", ["all"], "ukernels"),
])
def test_iree_option_values_are_checked(tmp_path, field, value, match):
    path, _, _ = _saved(tmp_path)
    _as_iree_artifact(path, {field: value})
    _refused_quickly(qlower.load, path, f"IreeOptions.{match}")


@pytest.mark.parametrize("fields,match", [
    ({"threads": -1}, "threads"), ({"threads": "4"}, "threads"),
    ({"optimization": "all; rm"}, "optimization"),
    ({"disabled_optimizers": ["a b"]}, "disabled_optimizers"),
    ({"optimized_model_filepath": "/tmp/x.onnx"}, "never taken from a file"),
])
def test_onnxruntime_option_values_are_checked(tmp_path, fields, match):
    path, _, _ = _saved(tmp_path)
    parts = _parts(path)
    meta = _meta(parts)
    meta["backend_options"]["fields"].update(fields)
    parts["extra/qlower.json"] = json.dumps(meta).encode()
    _refused_quickly(qlower.load, _write(path, parts), match)


def test_options_allow_lists_cover_every_field_but_the_free_form_ones():
    """Every options field is either allow-listed with a check or withheld from files; the
    withheld ones are the strings that reach a compiler or a shell."""
    import dataclasses

    from qlower.backends.onnxruntime import OrtOptions
    from qlower.backends.openvino import OvOptions
    classes = [OrtOptions, OvOptions]
    if HAS_IREE:
        from qlower.backends.iree import IreeOptions
        classes.append(IreeOptions)
    withheld = {}
    for cls in classes:
        allowed = saved_options.ALLOWED_FIELDS[cls.__qualname__]()
        names = {f.name for f in dataclasses.fields(cls)}
        assert set(allowed) <= names
        withheld[cls.__qualname__] = sorted(names - set(allowed))
        assert saved_options.from_json(saved_options.to_json(cls()), cls, "x")[0] == cls()
    assert withheld == {"OrtOptions": [], "OvOptions": [], **({"IreeOptions": ["extra_flags"]} if HAS_IREE else {})}


@pytest.fixture(scope="module")
def iree_int8(tmp_path_factory):
    if not HAS_IREE:
        pytest.skip("iree not installed")
    from qlower.backends.iree import IreeOptions
    tmp = tmp_path_factory.mktemp("iree")
    path, cm, x = _saved(tmp, backend="iree", quantize="int8", backend_options=IreeOptions(conv_im2col=False))
    return path, cm, x


def test_honest_iree_int8_artifact_loads_bit_exact(iree_int8):
    path, cm, x = iree_int8
    loaded = qlower.load(path)
    assert torch.equal(loaded(x), cm(x)) and loaded.backend_options == cm.backend_options
    assert not loaded.report().fallbacks


def test_extra_flags_passed_to_load_reach_iree(iree_int8, tmp_path):
    """Flags stay possible, from whoever loads the file: the same shell-reaching flag, passed to
    load, runs (the user's choice). The file itself carries none."""
    from qlower.backends.iree import IreeOptions
    path, _, _ = iree_int8
    marker = tmp_path / "flag-reached-iree"
    options = IreeOptions(conv_im2col=False, extra_flags=(EVIL_FLAG.format(marker=marker),))
    qlower.load(path, backend_options=options)
    assert marker.exists()
    with pytest.raises(ArtifactError, match="compiled for 'iree'"):
        from qlower.backends.onnxruntime import OrtOptions
        qlower.load(path, backend_options=OrtOptions())


@pytest.mark.skipif(not HAS_IREE, reason="iree not installed")
def test_save_withholds_extra_flags_and_load_says_so(tmp_path):
    from qlower.backends.iree import IreeOptions
    path, _, _ = _saved(tmp_path)
    _as_iree_artifact(path, {})
    parts = _parts(path)
    meta = _meta(parts)
    meta["backend_options"]["withheld"] = ["extra_flags"]
    parts["extra/qlower.json"] = json.dumps(meta).encode()
    _write(path, parts)
    options = IreeOptions(extra_flags=("--mlir-print-op-on-diagnostic=false",))
    saved = saved_options.to_json(options)
    assert "extra_flags" not in saved["fields"] and saved["withheld"] == ["extra_flags"]
    with pytest.warns(UserWarning, match="extra_flags"):
        qlower.load(path)


# ---------------------------------------------------------------- 2: operators

def _program(parts) -> dict:
    return json.loads(parts["models/model.json"])


def _tensor_meta(dtype: int, sizes: list[int]) -> dict:
    strides, step = [], 1
    for s in reversed(sizes):
        strides.insert(0, step)
        step *= s
    return {"dtype": dtype, "sizes": [{"as_int": s} for s in sizes], "requires_grad": False,
            "device": {"type": "cpu", "index": None}, "strides": [{"as_int": s} for s in strides],
            "storage_offset": {"as_int": 0}, "layout": 7}


def _node(target, inputs, out, meta, graph):
    graph["tensor_values"][out] = meta
    return {"target": target, "inputs": inputs, "outputs": [{"as_tensor": {"name": out}}],
            "metadata": {}, "is_hop_single_tensor_return": None, "name": out}


def _arg(name, arg, kind=1):
    return {"name": name, "arg": arg, "kind": kind}


def _from_file_program(parts, secret, *, shared=False, write=False):
    """The program returns `size` bytes of `secret` (aten::from_file), or with shared=True and
    an in-place copy of the bias into that tensor, writes the bias's bytes into `secret`."""
    program = _program(parts)
    graph = program["graph_module"]["graph"]
    size, dtype = (4, 7) if write else (16, 1)   # float32 x 4 over the bias, or 16 bytes
    nodes = [_node("torch.ops.aten.from_file.default",
                   [_arg("filename", {"as_string": str(secret)}), _arg("shared", {"as_bool": shared}),
                    _arg("size", {"as_int": size}), _arg("dtype", {"as_scalar_type": dtype}, kind=2)],
                   "leak", _tensor_meta(dtype, [size]), graph)]
    out = "leak"
    if write:
        bias = next(n for n in graph["tensor_values"] if n.endswith("bias"))
        nodes.append(_node("torch.ops.aten.copy_.default",
                           [_arg("self", {"as_tensor": {"name": "leak"}}), _arg("src", {"as_tensor": {"name": bias}})],
                           "copy_", _tensor_meta(dtype, [size]), graph))
        out = "copy_"
    graph["nodes"] = nodes + graph["nodes"]
    graph["outputs"] = [{"as_tensor": {"name": out}}]
    sig = program["graph_module"]["signature"]
    sig["output_specs"] = [{"user_output": {"arg": {"as_tensor": {"name": out}}}}]
    parts["models/model.json"] = json.dumps(program).encode()
    return parts


def _loaders():
    return {"load": lambda p: qlower.load(p)(torch.randn(2, 8)),
            "load_pt2 + module()": lambda p: qlower.load_pt2(p).module()(torch.randn(2, 8)),
            "compile(load_pt2)": lambda p: qlower.compile(qlower.load_pt2(p), (torch.randn(2, 8),),
                                                          backend="onnxruntime")(torch.randn(2, 8))}


@pytest.mark.parametrize("loader", list(_loaders()))
@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
def test_from_file_cannot_read_a_file(tmp_path, backend, loader):
    """Attack 2: aten::from_file with the author's path returned any readable file's bytes as
    the model's output."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"the user's secret key material!!")
    path, _, _ = _saved(tmp_path, backend=backend)
    _write(path, _from_file_program(_parts(path), secret))
    err = _refused_quickly(_loaders()[loader], path, "aten::from_file")
    assert err.node == "leak" and "field 'target'" in str(err) and "models/model.json" in str(err)


def test_from_file_cannot_write_a_file(tmp_path):
    """Attack 2, writing: shared=True maps the author's file and an in-place copy into that
    tensor wrote it at the first call after load."""
    victim = tmp_path / "victim"
    victim.write_bytes(bytes(16))
    path, _, _ = _saved(tmp_path)
    _write(path, _from_file_program(_parts(path), victim, shared=True, write=True))
    for load in (qlower.load, qlower.load_pt2):
        with pytest.raises(ArtifactError, match="aten::from_file"):
            load(path)(torch.randn(2, 8)) if load is qlower.load else load(path).module()(torch.randn(2, 8))
    assert victim.read_bytes() == bytes(16)


def _user_input(program) -> str:
    spec = next(s for s in program["graph_module"]["signature"]["input_specs"] if "user_input" in s)
    return spec["user_input"]["arg"]["as_tensor"]["name"]


@pytest.mark.parametrize("into", ["parameter", "input", "input through split", "input through _unsafe_view"])
def test_in_place_writes_only_into_tensors_the_program_owns(tmp_path, into):
    """A program may write its buffers, constants and the tensors it computed; not its
    parameters, nor the caller's input tensor, directly or through a view (a list result picked
    by getitem, or _unsafe_view, whose schema does not declare that it aliases)."""
    path, _, _ = _saved(tmp_path, backend="reference")
    parts = _parts(path)
    program = _program(parts)
    graph = program["graph_module"]["graph"]
    name = _user_input(program) if into.startswith("input") else \
        next(n for n in graph["tensor_values"] if n.endswith("weight"))
    meta = graph["tensor_values"][name]
    nodes, target = [], name
    if into == "input through split":
        nodes.append({"target": "torch.ops.aten.split.Tensor", "name": "parts", "metadata": {},
                      "is_hop_single_tensor_return": None,
                      "inputs": [_arg("self", {"as_tensor": {"name": name}}), _arg("split_size", {"as_int": 1})],
                      "outputs": [{"as_tensors": [{"name": "part0"}, {"name": "part1"}]}]})
        graph["tensor_values"]["part0"] = graph["tensor_values"]["part1"] = _tensor_meta(7, [1, 8])
        target, meta = "part0", _tensor_meta(7, [1, 8])
    elif into == "input through _unsafe_view":
        nodes.append(_node("torch.ops.aten._unsafe_view.default",
                           [_arg("self", {"as_tensor": {"name": name}}), _arg("size", {"as_ints": [16]})],
                           "flat", _tensor_meta(7, [16]), graph))
        target, meta = "flat", _tensor_meta(7, [16])
    nodes.append(_node("torch.ops.aten.zero_.default", [_arg("self", {"as_tensor": {"name": target}})],
                       "zeroed", meta, graph))
    graph["nodes"] = nodes + graph["nodes"]
    parts["models/model.json"] = json.dumps(program).encode()
    _write(path, parts)
    err = _refused_quickly(qlower.load_pt2, path, "user input or a parameter")
    assert err.node == "zeroed" and name in str(err)


class InPlace(torch.nn.Module):
    """In-place writes into computed tensors, which torch.export's training IR keeps (and
    qlower's folding turns `zeros` into a constant that copy_ then writes)."""

    def forward(self, x):
        y = x * 2
        y.add_(1)
        y[0] = 0
        z = torch.zeros(3, 4)
        z[:, 1] = x[0, :3]
        return y, z


def test_in_place_writes_into_computed_tensors_and_constants_load(tmp_path):
    x = torch.randn(3, 4)
    want = InPlace()(x)
    ep = torch.export.export(InPlace(), (x,))
    got = qlower.load_pt2(qlower.save_pt2(ep, tmp_path / "p.pt2")).module()(x)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    cm = qlower.compile(InPlace(), (x,), backend="onnxruntime")
    got = qlower.load(cm.save(tmp_path / "c.pt2"))(x)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_stateful_model_still_updates_its_buffer_after_load(tmp_path):
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.zeros(()))

        def forward(self, x):
            self.n.add_(1)
            return x + self.n
    cm = qlower.compile(Counter().eval(), (torch.zeros(2),), backend="onnxruntime")
    loaded = qlower.load(cm.save(tmp_path / "c.pt2"))
    loaded(torch.zeros(2))
    assert torch.equal(loaded(torch.zeros(2)), torch.full((2,), 2.0))


@pytest.mark.parametrize("op", [
    "aten.from_file.default", "aten._print.default", "aten.set_.source_Tensor", "aten._copy_from.default",
    "aten._reshape_alias.default", "aten.sparse_coo_tensor.indices", "aten._nested_view_from_buffer.default",
    "aten.pin_memory.default", "aten.record_stream.default", "aten._backward.default", "aten.resize_.default",
    "aten.requires_grad_.default", "aten._sparse_coo_tensor_unsafe.default"])
def test_operators_that_touch_files_memory_or_process_are_refused(op):
    packet, overload = op.rsplit(".", 1)
    target = getattr(getattr(torch.ops.aten, packet.split(".", 1)[1]), overload)
    assert allowlist.operator_problem(target) is not None


def test_operators_of_other_namespaces_and_higher_order_ops():
    cond = torch.ops.higher_order.cond
    assert allowlist.operator_problem(torch.ops.higher_order.print) is not None
    assert allowlist.operator_problem(torch.ops.higher_order.inline_asm_elementwise) is not None
    assert allowlist.operator_problem(torch.ops.higher_order.run_const_graph) is not None
    assert allowlist.operator_problem(cond) is None
    assert allowlist.operator_problem(torch.ops.c10d_functional.all_reduce.default) is not None
    assert allowlist.operator_problem(torch.ops.aten.add) is not None   # a packet, not an overload
    import builtins
    assert allowlist.operator_problem(os.system) and allowlist.operator_problem(builtins.open)


def test_operators_qlower_and_export_produce_are_allowed():
    """The ops in qlower's saved zoo programs (fp32 and int8) and ops export leaves in a program
    (composite, non-core) pass the allow-list."""
    import operator
    ops = [torch.ops.aten._assert_tensor_metadata.default, torch.ops.aten.adaptive_avg_pool2d.default,
           torch.ops.aten.batch_norm.default, torch.ops.aten.conv1d.default, torch.ops.aten.conv2d.default,
           torch.ops.aten.embedding.default, torch.ops.aten.flatten.using_ints, torch.ops.aten.gelu.default,
           torch.ops.aten.layer_norm.default, torch.ops.aten.linear.default, torch.ops.aten.lstm.input,
           torch.ops.aten.matmul.default, torch.ops.aten.max_pool2d.default, torch.ops.aten.softmax.int,
           torch.ops.aten.sym_size.int, torch.ops.aten.to.dtype, torch.ops.aten.unbind.int,
           torch.ops.aten.histc.default, torch.ops.aten.scaled_dot_product_attention.default,
           torch.ops.aten._local_scalar_dense.default, torch.ops.aten.masked_select.default,
           torch.ops.aten.empty.memory_format, torch.ops.aten.copy_.default, torch.ops.aten.index_put.default,
           torch.ops.aten.bernoulli.p, torch.ops.aten._assert_scalar.default,
           torch.ops.qlower.linear.default, torch.ops.qlower.quantize.default, torch.ops.qlower.requantize.default,
           torch.ops.qlower.layer_norm.default, torch.ops.qlower.softmax_integer.default, operator.getitem,
           torch.sym_max]
    refused = {str(op): allowlist.operator_problem(op) for op in ops if allowlist.operator_problem(op)}
    assert not refused


def test_string_arguments_cannot_break_out_of_text_formats(tmp_path):
    path, _, _ = _saved(tmp_path, backend="reference")
    parts = _parts(path)
    program = _program(parts)
    graph = program["graph_module"]["graph"]
    relu = next(n for n in graph["nodes"] if n["target"].endswith("relu.default"))
    relu["target"] = "torch.ops.aten.gelu.default"
    relu["inputs"].append(_arg("approximate", {"as_string": 'tanh" } %evil = "'}, kind=2))
    parts["models/model.json"] = json.dumps(program).encode()
    _write(path, parts)
    _refused_quickly(qlower.load_pt2, path, "string argument")


# ---------------------------------------------------------------- 3: symbolic expressions

def _dynamic_pt2(tmp_path):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.cat([x, x]).reshape(-1) * 2
    ep = torch.export.export(M(), (torch.randn(5, 8),), dynamic_shapes=({0: torch.export.Dim("b", min=2, max=64)},))
    return qlower.save_pt2(ep, tmp_path / "dyn.pt2")


def _with_expression(path, expr):
    parts = _parts(path)
    program = _program(parts)
    stack = [program]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if "expr_str" in item:
                item["expr_str"] = expr
                break
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    parts["models/model.json"] = json.dumps(program).encode()
    return _write(path, parts)


def test_honest_dynamic_program_loads(tmp_path):
    path = _dynamic_pt2(tmp_path)
    x = torch.randn(7, 8)
    assert torch.equal(qlower.load_pt2(path).module()(x), torch.cat([x, x]).reshape(-1) * 2)


@pytest.mark.parametrize("expr", [
    "9**9**7",                                    # grew load time ~30x per exponent step
    "Pow(Integer(9), Pow(Integer(9), Integer(7)))",
    "99999999!",                                  # factorial notation
    "N(E, 10**8)",                                # evaluates e to 10^8 digits
    "s77 + 2^10000000",                           # sympify reads ^ as a power
    "LShift(1, 1000000000)",
    "Symbol('s77', integer=True) * " + "9" * 30,  # a literal beyond 2**64
    "Float('1.5', precision=100000000)",
    "+".join(["Integer(1)"] * 600),              # beyond the length bound
])
def test_costly_symbolic_expressions_are_refused_quickly(tmp_path, expr):
    """Attack 3: a symbolic-shape expression passed the arithmetic filter and sympy evaluated
    it while the program was rebuilt."""
    path = _with_expression(_dynamic_pt2(tmp_path), expr)
    err = _refused_quickly(qlower.load_pt2, path, "symbolic expression")
    assert "expr_str" in str(err) and "models/model.json" in str(err)


def test_symbol_indices_in_range_constraints_are_bounded(tmp_path):
    """torch's deserializer counts up to every unbacked symbol's index (u99999999999: 10^11
    iterations)."""
    path = _dynamic_pt2(tmp_path)
    parts = _parts(path)
    program = _program(parts)
    program["range_constraints"]["u99999999999"] = {"min_val": 0, "max_val": 4}
    parts["models/model.json"] = json.dumps(program).encode()
    _refused_quickly(qlower.load_pt2, _write(path, parts), "u99999999999")


@pytest.mark.parametrize("expr", [
    "Symbol('s77', positive=True, integer=True)",
    "FloorDiv(Add(Symbol('s77', positive=True, integer=True), Integer(1)), Integer(2))",
    "Pow(Symbol('s77', positive=True, integer=True), Integer(2))",
    "LessThan(Symbol('u0', integer=True), Integer(8000))", "s0*2 + FloorDiv(s77, 4)", "Max(1, s3) - 1.5e3",
    "Mul(Integer(8), Symbol('s17', positive=True, integer=True), Symbol('s77', positive=True, integer=True))",
    "Float('0.5', precision=53)", "Rational(1, 2)", "-oo", "Integer(-1)"])
def test_the_grammar_torch_writes_is_accepted(expr):
    assert limits.safe_sym_expr(expr) is None


# ---------------------------------------------------------------- 4: zip parts

MIB = 1 << 20


@pytest.mark.parametrize("name", ["data/aotinductor/model/model.so", "extra/notes.txt"])
def test_zip_bomb_is_refused_before_it_is_inflated(tmp_path, name):
    """Attack 4: parts were inflated before their names and sizes were checked (a 532 kB file
    with a 512 MiB deflated part cost 512 MiB and 1.6 s before the refusal). A part under an
    allowed name (extra/) with a recomputed manifest even loaded."""
    path, _, _ = _saved(tmp_path)
    count = 512 if name.endswith(".so") else 64
    _write(path, _parts(path), streams={name: (bytes(MIB), count)})
    assert path.stat().st_size < 1 << 20
    match = name if name.endswith(".so") else "refused before inflating"
    for load in (qlower.load, qlower.load_pt2):
        _refused_quickly(load, path, match, seconds=0.5)


def test_declared_sizes_are_bounded_by_the_file(tmp_path):
    """Many parts each within the ratio, together far beyond what the file can hold."""
    path, _, _ = _saved(tmp_path)
    streams = {f"extra/part{i}.txt": (bytes(MIB), 1) for i in range(24)}   # 1 MiB each: within the ratio
    _write(path, _parts(path), streams=streams)
    _refused_quickly(qlower.load, path, "in all")


# ---------------------------------------------------------------- 5: JSON depth

@pytest.mark.parametrize("part", ["models/model.json", "data/weights/model_weights_config.json",
                                  "extra/qlower.json", artifact.MANIFEST])
def test_deeply_nested_json_is_a_typed_error(tmp_path, part):
    """Attack 5: a 200,000-deep nested JSON raised a raw RecursionError (the weights config and
    the manifest even before the manifest check)."""
    path, _, _ = _saved(tmp_path)
    parts = _parts(path)
    depth = 200_000
    parts[part] = parts[part].rstrip()[:-1] + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"
    _write(path, parts, fix_manifest=part != artifact.MANIFEST)
    for load in (qlower.load, qlower.load_pt2) if part != "extra/qlower.json" else (qlower.load,):
        err = _refused_quickly(load, path, "nests JSON")
        assert part in str(err)


def test_deep_json_inside_node_metadata_is_refused(tmp_path):
    """torch's deserializer json.loads each node's `from_node` / `custom` metadata string too."""
    path, _, _ = _saved(tmp_path)
    parts = _parts(path)
    program = _program(parts)
    depth = 200_000
    program["graph_module"]["graph"]["nodes"][0]["metadata"]["from_node"] = "[" * depth + "]" * depth
    parts["models/model.json"] = json.dumps(program).encode()
    err = _refused_quickly(qlower.load_pt2, _write(path, parts), "nests JSON")
    assert "node metadata" in str(err)


def test_json_depth_ignores_brackets_in_strings():
    assert limits.json_depth(b'{"a": "[[[[{{\\"[[", "b": [[1]]}') == 3
    assert limits.json_depth(b'["\\\\", [[]]]') == 3


# ---------------------------------------------------------------- 6: tensor payloads

def _weights_config(parts) -> dict:
    return json.loads(parts["data/weights/model_weights_config.json"])


def test_zero_stride_view_cannot_ask_for_terabytes(tmp_path):
    """Attack 6: a view with zero strides and size 2^20 x 2^20 over a 128-byte weight asked for
    4 TiB (the graph declaring the same shape)."""
    path, _, _ = _saved(tmp_path)
    parts = _parts(path)
    config = _weights_config(parts)
    entry = config["config"]["fc.weight"]
    entry["tensor_meta"]["sizes"] = [{"as_int": 1 << 20}, {"as_int": 1 << 20}]
    entry["tensor_meta"]["strides"] = [{"as_int": 0}, {"as_int": 0}]
    parts["data/weights/model_weights_config.json"] = json.dumps(config).encode()
    program = _program(parts)
    program["graph_module"]["graph"]["tensor_values"]["p_fc_weight"]["sizes"] = entry["tensor_meta"]["sizes"]
    parts["models/model.json"] = json.dumps(program).encode()
    _write(path, parts)
    for load in (qlower.load, qlower.load_pt2):
        err = _refused_quickly(load, path, "fc.weight")
        assert "data/weights/model_weights_config.json" in str(err) and "128 bytes" in str(err)


def test_empty_record_cannot_declare_a_large_weight(tmp_path):
    """Attack 6: an empty record declaring a 256 MiB weight allocated 256 MiB (torch.zeros)."""
    path, _, _ = _saved(tmp_path)
    parts = _parts(path)
    config = _weights_config(parts)
    entry = config["config"]["fc.weight"]
    entry["tensor_meta"]["sizes"] = [{"as_int": 1 << 26}]
    entry["tensor_meta"]["strides"] = [{"as_int": 1}]
    parts["data/weights/model_weights_config.json"] = json.dumps(config).encode()
    parts[f"data/weights/{entry['path_name']}"] = b""
    _write(path, parts)
    for load in (qlower.load, qlower.load_pt2):
        err = _refused_quickly(load, path, "fc.weight", memory=64 << 20)
        assert "holds 0 bytes" in str(err)


def test_view_beyond_its_record_is_refused(tmp_path):
    path, _, _ = _saved(tmp_path)
    parts = _parts(path)
    config = _weights_config(parts)
    config["config"]["fc.weight"]["tensor_meta"]["storage_offset"] = {"as_int": 1}
    parts["data/weights/model_weights_config.json"] = json.dumps(config).encode()
    _refused_quickly(qlower.load_pt2, _write(path, parts), "reaching element 32")


# ---------------------------------------------------------------- 7: malformed metadata

def _with_meta(path, change):
    parts = _parts(path)
    meta = _meta(parts)
    change(meta)
    parts["extra/qlower.json"] = json.dumps(meta).encode()
    return _write(path, parts)


@pytest.mark.parametrize("what,change", [
    ("negative example dim", lambda m: m.update(example_inputs=[[-2, 8]])),
    ("2^62 example dim", lambda m: m.update(example_inputs=[[1 << 62, 8]])),
    ("example dim off its spec", lambda m: m.update(example_inputs=[[3, 8]])),
    ("backend as a list", lambda m: m["report"].update(backend=["onnxruntime"])),
    ("unknown backend", lambda m: m["report"].update(backend="os")),
    ("dtype qint8", lambda m: m["input_specs"][0].update(dtype="qint8")),
    ("dtype of another input", lambda m: m["input_specs"][0].update(dtype="int64")),
    ("static dim of another graph", lambda m: (m["input_specs"][0].update(shape=[3, 8]),
                                                m.update(example_inputs=[[3, 8]]))),
    ("two specs for one input", lambda m: (m["input_specs"].append(dict(m["input_specs"][0])),
                                           m["example_inputs"].append([2, 8]))),
    ("report cluster of the wrong type", lambda m: m["report"].update(clusters=[[1, 2]])),
    ("unprintable report", lambda m: m["report"]["clusters"][0].update(max_abs_diff="x")),
    ("nan_policy", lambda m: m.update(nan_policy=["raise"])),
    ("unknown field", lambda m: m.update(hooks="import os")),
])
def test_malformed_metadata_is_an_artifact_error_at_load(tmp_path, what, change):
    """Attack 7: metadata that verifies but is malformed gave raw RuntimeError / TypeError /
    NotImplementedError, some only at the first call."""
    path, _, _ = _saved(tmp_path)
    err = _refused_quickly(qlower.load, _with_meta(path, change), "extra/qlower.json")
    assert "malformed" in str(err) or "qlower.json" in str(err)


@pytest.mark.parametrize("change", ["shape", "dtype"])
def test_weight_disagreeing_with_the_graph_is_refused_at_load(tmp_path, change):
    """Attack 7: a weight whose shape or dtype disagreed with the graph loaded, then raised a
    raw RuntimeError at the first call."""
    path, _, _ = _saved(tmp_path)
    parts = _parts(path)
    config = _weights_config(parts)
    meta = config["config"]["fc.bias"]["tensor_meta"]
    if change == "shape":
        meta["sizes"] = [{"as_int": 2}]
    else:
        meta.update(dtype=4, requires_grad=False)   # int32: the same 4 bytes per element
    parts["data/weights/model_weights_config.json"] = json.dumps(config).encode()
    _write(path, parts)
    for load in (qlower.load, qlower.load_pt2):
        err = _refused_quickly(load, path, "'fc.bias'")
        assert "graph declares" in str(err) and "data/weights/model_weights_config.json" in str(err)


# ---------------------------------------------------------------- output classes

_HF_OUTPUT = "transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions"


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory):
    """A tiny transformers BERT returning its ModelOutput, saved (onnxruntime)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, vocab_size=100)
    torch.manual_seed(0)
    model, ids = transformers.BertModel(cfg).eval(), torch.randint(0, 100, (1, 8))
    cm = qlower.compile(model, (ids,), backend="onnxruntime")
    return cm.save(tmp_path_factory.mktemp("hf") / "bert.pt2"), cm, ids


def test_a_transformers_model_loads_in_a_fresh_process(hf_bert, tmp_path):
    """Its output class is registered with pytree by importing transformers.modeling_outputs, the
    allow-listed module that defines it (it was 'not registered' unless transformers was imported
    first); the outputs equal the compiled model's."""
    import subprocess
    import sys

    path, cm, ids = hf_bert
    torch.save(ids, tmp_path / "ids.pt")
    script = (
        "import sys, torch\n"
        "assert 'transformers' not in sys.modules\n"
        "import qlower\n"
        "assert 'transformers' not in sys.modules\n"
        f"out = qlower.load({str(path)!r})(torch.load({str(tmp_path / 'ids.pt')!r}))\n"
        "print(type(out).__module__, type(out).__name__)\n"
        f"torch.save(tuple(out.values()), {str(tmp_path / 'out.pt')!r})\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == _HF_OUTPUT.rsplit(".", 1)
    expected = tuple(cm(ids).values())
    got = torch.load(tmp_path / "out.pt")
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))


def test_an_output_class_outside_the_allow_list_is_refused_unimported(hf_bert, tmp_path):
    """The file never chooses a module to import: a spec naming a class of any other module is
    refused, naming the class and saying what to import."""
    import sys

    path = tmp_path / "other.pt2"
    parts = _parts(hf_bert[0])
    program = parts["models/model.json"]
    assert _HF_OUTPUT.encode() in program
    parts["models/model.json"] = program.replace(_HF_OUTPUT.encode(), b"wsgiref.simple_server.Output")
    _write(path, parts)
    assert "wsgiref.simple_server" not in sys.modules
    for load in (qlower.load, qlower.load_pt2):
        err = _refused_quickly(load, path, "'wsgiref.simple_server.Output'")
        assert "not registered" in str(err) and "import wsgiref.simple_server" in err.hint
    assert "wsgiref.simple_server" not in sys.modules


# ---------------------------------------------------------------- honest files

@pytest.mark.parametrize("quantize", [None, "int8"])
@pytest.mark.parametrize("backend", ["reference", *[e for e in ENGINES if e != "iree"]])
def test_honest_files_load_bit_exact(tmp_path, backend, quantize):
    """Float and int8 artifacts of every installed backend (IREE: the iree_int8 test above and
    tests/test_artifacts.py) load and match the compiled model bit for bit."""
    path, cm, x = _saved(tmp_path, backend=backend, quantize=quantize)
    loaded = qlower.load(path)
    xs = torch.randn(2, 8)
    assert torch.equal(loaded(x), cm(x)) and torch.equal(loaded(xs), cm(xs))
    assert loaded.backend_options == cm.backend_options


def test_loaded_model_saves_again(tmp_path):
    """A loaded model makes its example inputs only when it is saved again."""
    path, cm, x = _saved(tmp_path)
    again = qlower.load(qlower.load(path).save(tmp_path / "again.pt2"))
    assert torch.equal(again(x), cm(x))
