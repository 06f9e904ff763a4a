"""CompiledModule: the callable result of qlower.compile, with report() and save()/load()."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from torch.fx import GraphModule

from .. import __version__
from ..errors import ArtifactError
from ..report import CompileReport
from .input_spec import InputSpec, check_inputs

ARTIFACT_FORMAT = 1
_META_NAME = "qlower.json"


class CompiledModule:
    """Calls have the original model's calling convention (same input/output structure)."""

    def __init__(self, graph_module: GraphModule, executable, input_specs: list[InputSpec],
                 report: CompileReport, example_inputs: tuple, dynamic_shapes=None):
        self.graph_module = graph_module
        self._executable = executable
        self.input_specs = input_specs
        self._report = report
        self._example_inputs = example_inputs
        self._dynamic_shapes = dynamic_shapes

    def __call__(self, *args):
        check_inputs(self.input_specs, args)
        if not self._executable.needs_no_grad:
            return self._executable.run(*args)
        with torch.no_grad():
            return self._executable.run(*args)

    def report(self) -> CompileReport:
        return self._report

    @property
    def backend(self) -> str:
        return self._report.backend

    def _sync_state(self) -> None:
        """Copy module state (buffers the program mutates: caches, recurrent state) from the
        running executable back into the graph that gets saved."""
        running = self._executable.module
        if running is None or running is self.graph_module:
            return
        live = dict(running.named_buffers())
        for name, buf in self.graph_module.named_buffers():
            if name in live and live[name].shape == buf.shape and live[name] is not buf:
                buf.copy_(live[name])

    def save(self, path: str | Path) -> Path:
        """Write one .pt2 file: the lowered program (with its current state) plus qlower's
        metadata as an extra file."""
        path = Path(path)
        self._sync_state()
        ep = torch.export.export(self.graph_module, self._example_inputs,
                                 dynamic_shapes=self._dynamic_shapes)
        meta = {"format": ARTIFACT_FORMAT, "qlower_version": __version__,
                "input_specs": [asdict(s) for s in self.input_specs],
                "report": self._report.to_dict(),
                "example_inputs": [list(t.shape) for t in self._example_inputs]}
        torch.export.save(ep, str(path), extra_files={_META_NAME: json.dumps(meta)})
        return path


def load(path: str | Path) -> CompiledModule:
    """Load a CompiledModule written by `CompiledModule.save` and recompile it for its backend."""
    from .. import ops  # noqa: F401  (register qlower ops before deserialising)
    from ..backends import get_backend

    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"no such qlower artifact: {path}")
    extra = {_META_NAME: ""}
    try:
        ep = torch.export.load(str(path), extra_files=extra)
        meta = json.loads(extra[_META_NAME])
    except Exception as exc:
        raise ArtifactError(f"{path} is not a qlower artifact: {str(exc)[:200]}") from exc
    if meta.get("format") != ARTIFACT_FORMAT:
        raise ArtifactError(f"{path} has artifact format {meta.get('format')}, expected {ARTIFACT_FORMAT}")
    report = CompileReport.from_dict(meta["report"])
    gm = ep.module()
    executable = get_backend(report.backend).compile(gm)
    specs = [InputSpec(s["name"], s["dtype"], tuple(s["shape"])) for s in meta["input_specs"]]
    examples = tuple(torch.zeros(shape, dtype=getattr(torch, s.dtype))
                     for shape, s in zip(meta["example_inputs"], specs))
    dynamic = _dynamic_shapes_from(specs)
    return CompiledModule(gm, executable, specs, report, examples, dynamic)


def _dynamic_shapes_from(specs: list[InputSpec]):
    if all(None not in s.shape for s in specs):
        return None
    return tuple({i: torch.export.Dim.AUTO for i, d in enumerate(s.shape) if d is None} or None
                 for s in specs)
