"""CompiledModule: the callable result of qlower.compile, with report() and save()/load()."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import threading
import warnings
from dataclasses import asdict
from pathlib import Path

import torch
from torch.fx import GraphModule

from ..core.version import __version__
from ..errors import ArtifactError, InputError, NonFiniteInputError, NonFiniteInputWarning
from ..backends.base import InputsRefused, compile_graph
from ..fx import mutated_attributes
from ..core.quiet import quiet
from ..core.types import CompileReport
from ..artifact import ARTIFACT_FORMAT, read_pt2, write_pt2
from ..input_spec import InputSpec, check_inputs, flat_checker
from ..onnx.io_names import input_names, output_names
from . import saved_options
from ..artifact.limits import load_json
from ..capture import serialized
from ..backends import backend_names, get_backend, options_backend

_META_NAME = "qlower.json"
NAN_POLICIES = ("warn", "raise", "ignore")


class CompiledModule:
    """Calls have the original model's calling convention (same input/output structure; keyword
    arguments bind by the model's parameter names).

    Threads: a model whose program writes module state (buffers: caches, counters, recurrent
    state) serializes calls with a lock, so no update is lost; a stateless one runs calls
    concurrently (the executables hold no per-call state)."""

    def __init__(self, graph_module: GraphModule, executable, input_specs: list[InputSpec],
                 report: CompileReport, example_inputs: tuple, dynamic_shapes=None, *,
                 backend_options=None, nan_policy: str = "warn"):
        if nan_policy not in NAN_POLICIES:
            raise InputError(f"unknown nan_policy {nan_policy!r}", hint=f"use one of {NAN_POLICIES}")
        self.graph_module = graph_module
        self._executable = executable
        self.input_specs = input_specs
        self._report = report
        # the Q/DQ program compile quantized, before qlower's lowering (export onnx_ops="qdq");
        # set by compile, None for a loaded model (a .pt2 keeps the lowered program only)
        self.quantized_program = None
        if not (report.inputs or report.outputs):   # the model's own names (exported files carry them)
            report.inputs, report.outputs = input_names(graph_module), output_names(graph_module)
        self._example_inputs = example_inputs
        self._dynamic_shapes = dynamic_shapes
        self.backend_options = backend_options
        self.nan_policy = nan_policy
        self._arg_names = _arg_names(graph_module, input_specs)
        self.stateful = bool(mutated_attributes(graph_module))
        self._lock = threading.Lock() if self.stateful else None
        # NaN/inf check: only quantized models turn NaN into ordinary-looking numbers
        self._float_inputs = [i for i, s in enumerate(input_specs) if s.torch_dtype.is_floating_point] \
            if report.quantized and nan_policy != "ignore" else []
        self._nan_warned = False
        self._take_engine_checks(executable)
        self._flat_ok = flat_checker(input_specs)
        # the engine validates the common call itself (each Python-side check after an engine
        # run costs several times its hot cost: caches; Executable.validating_run)
        self._validating_run = executable.validating_run if not self._float_inputs else None

    def __call__(self, *args, **kwargs):
        if kwargs:
            args = self._bind(args, kwargs)
        if self._lock is None:
            return self._call(args)
        with self._lock:
            return self._call(args)

    def _call(self, args: tuple):
        if self._validating_run is not None:
            try:
                return self._validating_run(args)
            except InputsRefused:
                pass   # checked below: a typed error naming the problem, or the general path
        if not self._flat_ok(args):   # the common call, checked in one pass
            check_inputs(self.input_specs, args)   # raises a typed error, or accepts a nested call
        if self._float_inputs:
            self._check_finite(args)
        return self._run(args)

    def _run(self, args: tuple):
        try:
            if not self._executable.needs_no_grad:
                return self._executable.run(*args)
            with torch.no_grad():
                return self._executable.run(*args)
        except RuntimeError as exc:
            if not str(exc).startswith("Runtime assertion failed"):
                raise
            # A size relation torch.export assumed while capturing (e.g. masked_select's output
            # no larger than its input, false when the mask broadcasts) does not hold here.
            raise InputError(f"these inputs break an assumption the captured program was built on: {exc}",
                             hint="capture with example inputs like these (or declare the dims dynamic "
                                  "with dynamic_shapes=)") from exc

    def _bind(self, args: tuple, kwargs: dict) -> tuple:
        """Keyword arguments in the model's parameter order (checked like positional ones)."""
        names = self._arg_names
        given = dict(kwargs)
        clash = [n for n in names[:len(args)] if n in given]
        missing = [n for n in names[len(args):] if n not in given]
        unknown = sorted(set(given) - set(names))
        if clash or missing or unknown or len(args) > len(names):
            what = (f"got multiple values for {clash}" if clash else f"unknown keyword(s) {unknown}" if unknown
                    else f"missing argument(s) {missing}" if missing else f"{len(args)} positional arguments")
            raise InputError(f"cannot bind the call: {what}",
                             hint=f"the compiled model takes ({', '.join(names)})")
        return tuple(args) + tuple(given[n] for n in names[len(args):])

    def _take_engine_checks(self, executable) -> None:
        """Inputs the engine sums inside its own run (executable.engine_checked_inputs) leave
        the per-call check here; the engine reports a non-finite sum to `_engine_nonfinite`."""
        checked = getattr(executable, "engine_checked_inputs", frozenset())
        covered = [i for i in self._float_inputs if self.input_specs[i].name in checked]
        if covered:
            executable.on_nonfinite(self._engine_nonfinite)
            self._float_inputs = [i for i in self._float_inputs if i not in covered]

    def _check_finite(self, args: tuple) -> None:
        """One sum per float input (NaN/inf propagate into it): measured 6-60x cheaper than
        isfinite(x).all(), which allocates a mask; only a non-finite sum (NaN/inf, or a finite
        input that overflowed the sum) pays for the exact check."""
        leaves = args if len(args) == len(self.input_specs) else torch.utils._pytree.tree_leaves(args)
        for i in self._float_inputs:
            x = leaves[i]
            if not math.isfinite(x.sum().item()) and self._nonfinite(i, x):
                return

    def _engine_nonfinite(self, name: str, x: torch.Tensor) -> None:
        index = next(i for i, s in enumerate(self.input_specs) if s.name == name)
        self._nonfinite(index, x, stacklevel=6)

    def _nonfinite(self, i: int, x: torch.Tensor, stacklevel: int = 4) -> bool:
        """Input i's sum was not finite: if it truly holds NaN/inf, apply the policy (True)."""
        if bool(torch.isfinite(x).all()):
            return False   # a finite input whose sum overflowed
        msg = (f"input {i} ('{self.input_specs[i].name}') holds NaN/inf; this quantized model maps "
               "NaN to a finite integer, so its output is not eager's")
        if self.nan_policy == "raise":
            raise NonFiniteInputError(msg, hint="clean the input (torch.nan_to_num) or compile with nan_policy='warn'")
        if not self._nan_warned:
            self._nan_warned = True
            warnings.warn(msg + " (warned once; nan_policy='raise' makes it an error)", NonFiniteInputWarning,
                          stacklevel=stacklevel)
        return True

    def report(self) -> CompileReport:
        return self._report

    def _examples(self) -> tuple:
        """The example inputs (a loaded model makes its zeros here, when it is saved again, not
        at load: their sizes come from the file)."""
        if callable(self._example_inputs):
            self._example_inputs = self._example_inputs()
        return self._example_inputs

    @property
    def backend(self) -> str:
        return self._report.backend

    def _live_state(self) -> dict[str, torch.Tensor]:
        """Copies of the running executable's module state (buffers the program mutates) that
        differ from the graph's own tensors. Nothing is written anywhere: the graph's buffers may
        be the caller's model's own tensors."""
        running = self._executable.module
        if running is None or running is self.graph_module:
            return {}
        live = dict(running.named_buffers())
        return {name: live[name].detach().clone() for name, buf in self.graph_module.named_buffers()
                if name in live and live[name].shape == buf.shape and live[name] is not buf}

    @quiet
    @serialized
    def save(self, path: str | Path) -> Path:
        """Write one .pt2 file: the lowered program with its current state, qlower's metadata and
        a sha256 manifest (see artifact/__init__.py), atomically. The caller's model is never
        written to: the running state replaces the saved program's copy of each buffer."""
        if self._lock is not None:
            with self._lock:
                state = self._live_state()
        else:
            state = self._live_state()
        examples = self._examples()
        ep = torch.export.export(self.graph_module, examples, dynamic_shapes=self._dynamic_shapes)
        for name, value in state.items():
            table = ep.state_dict if name in ep.state_dict else ep.constants if name in ep.constants else None
            if table is not None:
                table[name] = value
        meta = {"format": ARTIFACT_FORMAT, "qlower_version": __version__,
                "input_specs": [asdict(s) for s in self.input_specs],
                "report": self._report.to_dict(),
                "example_inputs": [list(t.shape) for t in examples],
                "backend_options": saved_options.to_json(self.backend_options),
                "nan_policy": self.nan_policy}
        return write_pt2(ep, path, extra_files={_META_NAME: json.dumps(meta)})


def _arg_names(gm: GraphModule, specs: list[InputSpec]) -> list[str]:
    """The model's parameter names, for keyword calls (placeholder names when the graph's
    forward only takes *args)."""
    try:
        params = list(inspect.signature(gm.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    if params and all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        return [p.name for p in params]
    return [s.name for s in specs]


_META_FIELDS = {"format", "qlower_version", "input_specs", "report", "example_inputs", "backend_options", "nan_policy"}
# dtypes an input may have (quantized tensor dtypes, bits and sub-byte integers have no kernels for inputs)
_INPUT_DTYPES = frozenset({"float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64",
                           "uint16", "uint32", "uint64", "bool", "complex64", "complex128", "complex32",
                           "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})
_MAX_RANK = 64
_MAX_DIM = (1 << 31) - 1


@quiet
@serialized   # compiles the program again (capture.COMPILE_LOCK)
def load(path: str | Path, *, backend_options=None) -> CompiledModule:
    """Load a CompiledModule written by `CompiledModule.save` and recompile it for its backend.
    The file is checked before anything in it is deserialized and nothing in it is unpickled
    or executed (artifact/__init__.py, docs/trust.md). Its backend options are limited to an
    allow-list of fields (runtime/saved_options.py); compiler flags and paths are never taken
    from a file: pass `backend_options` (the saved backend's options class, e.g.
    IreeOptions(extra_flags=(...))) to compile with your own options instead of the file's."""
    ep, extras, _ = read_pt2(path, require_manifest=True)
    report, specs, shapes, options, nan_policy, withheld = _parse_meta(extras.get(_META_NAME), path)
    _check_specs_against_graph(specs, ep, path)
    if backend_options is not None:
        if options_backend(backend_options) != report.backend:
            raise ArtifactError(f"backend_options are {type(backend_options).__name__}, but {path} was compiled "
                                f"for {report.backend!r}", hint="pass the options class of the artifact's backend")
        options = backend_options
    elif withheld:
        warnings.warn(f"{path} was saved with {', '.join(withheld)} set, which a file never supplies; it is "
                      f"compiled without them (pass backend_options= to qlower.load to set them)", stacklevel=2)
    gm = _restore_default_args(ep.module())
    executable = compile_graph(get_backend(report.backend, options), gm)
    examples = functools.partial(_zeros, shapes, specs)
    return CompiledModule(gm, executable, specs, report, examples, _dynamic_shapes_from(specs),
                          backend_options=options, nan_policy=nan_policy)


def _zeros(shapes, specs) -> tuple:
    return tuple(torch.zeros(shape, dtype=s.torch_dtype) for shape, s in zip(shapes, specs))


def _parse_meta(text: str | None, path):
    """(report, input specs, example shapes, backend options, nan_policy, withheld option names)
    from qlower.json; any malformed field is an ArtifactError naming the part (the manifest
    verified, so whoever wrote the file made it so)."""
    part = "extra/qlower.json"
    if text is None:
        raise ArtifactError(f"{path}: part '{part}' is missing", hint="the file is not a qlower artifact")
    meta = load_json(text, part, path)
    try:
        if not isinstance(meta, dict) or set(meta) - _META_FIELDS:
            unknown = sorted(set(meta) - _META_FIELDS)[:3] if isinstance(meta, dict) else meta
            raise ValueError(f"unknown fields {unknown}")
        report = CompileReport.from_dict(meta["report"])
        if not isinstance(report.backend, str) or report.backend not in backend_names():
            raise ValueError(f"report.backend {str(report.backend)[:40]!r} is not one of {backend_names()}")
        if not isinstance(report.quantized, bool) or not isinstance(report.profile, str):
            raise ValueError("report.quantized must be a bool and report.profile a string")
        str(report), json.dumps(report.to_dict())   # every field prints and saves again
        specs = [_spec_from_json(s) for s in meta["input_specs"]]
        shapes = [_example_shape(shape, spec) for shape, spec in zip(meta["example_inputs"], specs)]
        nan_policy = meta.get("nan_policy", "warn")
        if nan_policy not in NAN_POLICIES or len(meta["example_inputs"]) != len(specs):
            raise ValueError("nan_policy or example inputs do not match the input specs")
    except ArtifactError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise ArtifactError(f"{path}: qlower metadata is malformed (part '{part}'): {type(exc).__name__}: "
                            f"{str(exc)[:200]}",
                            hint="the artifact's metadata was modified; re-save it from the source model") from exc
    default = getattr(get_backend(report.backend), "options", None)
    cls = type(default) if default is not None and dataclasses.is_dataclass(default) else None
    options, withheld = saved_options.from_json(meta.get("backend_options"), cls, path)
    return report, specs, shapes, options, nan_policy, withheld


def _spec_from_json(s: dict) -> InputSpec:
    if not isinstance(s, dict) or not isinstance(s.get("dtype"), str) or s["dtype"] not in _INPUT_DTYPES \
            or not isinstance(getattr(torch, s["dtype"], None), torch.dtype):
        raise ValueError(f"input dtype {str(s.get('dtype') if isinstance(s, dict) else s)[:40]!r} is not one of "
                         f"the input dtypes")
    if not isinstance(s["name"], str) or not isinstance(s["shape"], list) or len(s["shape"]) > _MAX_RANK:
        raise ValueError("an input spec's name must be a string and its shape a list of at most 64 dims")
    shape = tuple(None if d is None else _dim(d) for d in s["shape"])
    bounds = tuple(None if b is None else _bound(b) for b in s.get("bounds", ()))
    if len(bounds) not in (0, len(shape)):
        raise ValueError("an input spec has bounds for another rank")
    return InputSpec(s["name"], s["dtype"], shape, bounds)


def _dim(d) -> int:
    if type(d) is not int or not 0 <= d <= _MAX_DIM:
        raise ValueError(f"dim {str(d)[:30]} is not an integer in [0, {_MAX_DIM}]")
    return d


def _bound(b) -> tuple[int, int | None]:
    if not isinstance(b, list) or len(b) != 2:
        raise ValueError("a dynamic dim's bounds must be [min, max]")
    lo, hi = _dim(b[0]), None if b[1] is None else _dim(b[1])
    if hi is not None and hi < lo:
        raise ValueError(f"a dynamic dim's bounds [{lo}, {hi}] are empty")
    return lo, hi


def _example_shape(shape, spec: InputSpec) -> tuple[int, ...]:
    """An example input's shape: the spec's rank, its static dims, dynamic dims within their
    declared bounds."""
    if not isinstance(shape, list) or len(shape) != len(spec.shape):
        raise ValueError(f"example input for '{spec.name}' does not have the rank of its spec")
    dims = tuple(_dim(d) for d in shape)
    for axis, (want, got) in enumerate(zip(spec.shape, dims)):
        bound = spec.bounds[axis] if spec.bounds else None
        if (want is not None and want != got) or (bound is not None and not
                                                  (bound[0] <= got and (bound[1] is None or got <= bound[1]))):
            raise ValueError(f"example input for '{spec.name}' has dim {axis} = {got}, outside its spec")
    return dims


def _check_specs_against_graph(specs: list[InputSpec], ep, path) -> None:
    """The input specs (qlower.json) describe the graph's user inputs: one per input, same dtype,
    same rank, same static sizes; else calls would fail inside the program, not at load."""
    names = ep.graph_signature.user_inputs
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    vals = [nodes[n].meta.get("val") if n in nodes else None for n in names]
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    problem = None
    if len(tensors) != len(specs):
        problem = f"{len(specs)} input specs for {len(tensors)} tensor inputs of the graph"
    for spec, val in zip(specs, tensors):
        declared = tuple(d if isinstance(d, int) else None for d in val.shape)
        if problem is None and (spec.torch_dtype != val.dtype or len(spec.shape) != len(declared) or
                                any(a is not None and b is not None and a != b for a, b in zip(spec.shape, declared))):
            problem = (f"input '{spec.name}' is {spec.describe()} but the graph takes "
                       f"{str(val.dtype)[6:]}[{', '.join('*' if d is None else str(d) for d in declared)}]")
    if problem:
        raise ArtifactError(f"{path}: qlower metadata is malformed (part 'extra/qlower.json'): {problem}",
                            hint="the artifact's metadata was modified; re-save it from the source model")


def _restore_default_args(gm: GraphModule) -> GraphModule:
    """Serialization drops trailing arguments equal to their schema default (e.g. requantize's
    profile); backends index qlower ops' arguments by position, so they are put back."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) \
                or target.namespace != "qlower":
            continue
        args = list(node.args)
        for arg in target._schema.arguments[len(args):]:
            if arg.kwarg_only or arg.name in node.kwargs or not arg.has_default_value():
                break
            args.append(arg.default_value)
        node.args = tuple(args)
    gm.recompile()
    return gm


def _dynamic_shapes_from(specs: list[InputSpec]):
    if all(None not in s.shape for s in specs):
        return None
    return tuple({i: torch.export.Dim.AUTO for i, d in enumerate(s.shape) if d is None} or None
                 for s in specs)
