"""CompiledModule: the callable result of qlower.compile, with report() and save()/load()."""
from __future__ import annotations

import dataclasses
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
from ..backends.base import InputsRefused
from ..fx import mutated_attributes
from ..core.types import CompileReport
from ..artifact import ARTIFACT_FORMAT, read_pt2, write_pt2
from ..input_spec import InputSpec, check_inputs, flat_checker

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

    def save(self, path: str | Path) -> Path:
        """Write one .pt2 file: the lowered program with its current state, qlower's metadata and
        a sha256 manifest (see runtime/artifact.py), atomically. The caller's model is never
        written to: the running state replaces the saved program's copy of each buffer."""
        if self._lock is not None:
            with self._lock:
                state = self._live_state()
        else:
            state = self._live_state()
        ep = torch.export.export(self.graph_module, self._example_inputs, dynamic_shapes=self._dynamic_shapes)
        for name, value in state.items():
            table = ep.state_dict if name in ep.state_dict else ep.constants if name in ep.constants else None
            if table is not None:
                table[name] = value
        meta = {"format": ARTIFACT_FORMAT, "qlower_version": __version__,
                "input_specs": [asdict(s) for s in self.input_specs],
                "report": self._report.to_dict(),
                "example_inputs": [list(t.shape) for t in self._example_inputs],
                "backend_options": _options_to_json(self.backend_options),
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


def _options_to_json(options) -> dict | None:
    if options is None:
        return None
    if not dataclasses.is_dataclass(options):
        raise ArtifactError(f"backend options of type {type(options).__name__} cannot be saved",
                            hint="backend options are dataclasses such as OrtOptions")
    return {"class": type(options).__qualname__, "fields": asdict(options)}


def _options_from_json(data, backend_name: str):
    """Rebuild the backend's own options dataclass (never a class named by the file)."""
    if data is None:
        return None
    from ..backends import get_backend
    default = getattr(get_backend(backend_name), "options", None)
    cls = type(default)
    if default is None or not dataclasses.is_dataclass(default) or data.get("class") != cls.__qualname__:
        raise ArtifactError(f"saved backend options {data.get('class')!r} do not belong to backend {backend_name!r}",
                            hint="the artifact's metadata was modified")
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(data["fields"]).items()}
    return cls(**fields)


def load(path: str | Path) -> CompiledModule:
    """Load a CompiledModule written by `CompiledModule.save` and recompile it for its backend
    (with its saved backend options). The file is checked before anything in it is deserialized
    and nothing in it is unpickled or executed (runtime/artifact.py, docs/trust.md)."""
    from ..backends import get_backend
    from ..backends.base import compile_graph
    ep, extras, _ = read_pt2(path, require_manifest=True)
    report, specs, shapes, options, nan_policy = _parse_meta(extras.get(_META_NAME), path)
    gm = _restore_default_args(ep.module())
    executable = compile_graph(get_backend(report.backend, options), gm)
    examples = tuple(torch.zeros(shape, dtype=s.torch_dtype) for shape, s in zip(shapes, specs))
    return CompiledModule(gm, executable, specs, report, examples, _dynamic_shapes_from(specs),
                          backend_options=options, nan_policy=nan_policy)


def _parse_meta(text: str | None, path):
    """(report, input specs, example shapes, backend options, nan_policy) from qlower.json; any
    malformed field is an ArtifactError (the manifest verified, so the writer made it so)."""
    try:
        meta = json.loads(text)
        report = CompileReport.from_dict(meta["report"])
        specs = [_spec_from_json(s) for s in meta["input_specs"]]
        shapes = [tuple(int(d) for d in shape) for shape in meta["example_inputs"]]
        options = _options_from_json(meta.get("backend_options"), report.backend)
        nan_policy = meta.get("nan_policy", "warn")
        if nan_policy not in NAN_POLICIES or len(shapes) != len(specs):
            raise ValueError("nan_policy or example inputs do not match the input specs")
    except ArtifactError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ArtifactError(f"{path}: qlower metadata is malformed: {type(exc).__name__}: {str(exc)[:200]}",
                            hint="the artifact's metadata was modified; re-save it from the source model") from exc
    return report, specs, shapes, options, nan_policy


def _spec_from_json(s: dict) -> InputSpec:
    if not isinstance(getattr(torch, str(s["dtype"]), None), torch.dtype):
        raise ValueError(f"{s['dtype']!r} is not a torch dtype")
    shape = tuple(None if d is None else int(d) for d in s["shape"])
    bounds = tuple(None if b is None else (int(b[0]), None if b[1] is None else int(b[1]))
                   for b in s.get("bounds", ()))
    return InputSpec(str(s["name"]), str(s["dtype"]), shape, bounds)


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
