"""`qlower.export(cm, path, format="mlir" | "vmfb")`, whatever backend the model was compiled
for (its quantized program is compiled for IREE when it was not).

Only a model that is ONE IREE cluster can be exported (its inputs are the model's inputs in
order, its one output the model's output): anything else would need qlower's PyTorch glue to
run. The files are exactly what the backend compiled and runs:

- `.mlir`: the module as emitted (TOSA + linalg functions for an integer cluster, the torch
  dialect for an all-float one), preceded by `//` comment lines naming the entry function and
  the iree-compile command line that compiles it as the backend did (same outputs);
- `.vmfb`: the compiled module, runnable with `iree-run-module --module=m.vmfb
  --function=main --input=@x.npy` (iree-base-runtime) and no Python at all.

`target` ("cuda:sm_80", "rocm:gfx942", "vulkan-spirv:ampere", "llvm-cpu:znver4") compiles the
same MLIR for another device instead of writing the module the backend runs: a model is
compiled and checked where it is developed, and its .vmfb deployed on a GPU host that has
only iree-base-runtime (docs/iree.md, "GPU targets").
"""
from __future__ import annotations

from pathlib import Path

from ...errors import BackendError
from ..base import compile_graph, whole_model
from .compiler import compile_command, compile_mlir
from .options import IreeOptions
from .runner import IreeCluster
from ...artifact import atomic_write
from .data_tiling import data_tiling_for

ENTRY = "main"
_INPUT_TYPE = {"tosa": "tosa", "torch": "torch"}


def whole_model_cluster(cm, backend_class=None) -> IreeCluster:
    """The IREE cluster that is the whole model, or a BackendError naming what prevents it (the
    nodes left in PyTorch, with their reasons). A model compiled for another backend (or loaded)
    has its quantized program (`cm.graph_module`) compiled here by `backend_class` (IreeBackend)."""
    if cm.backend == "iree":
        executable = cm._executable
    elif backend_class is None:
        raise BackendError(f"the model was compiled for {cm.backend!r}, not iree", hint="qlower.export compiles it")
    else:
        executable = compile_graph(backend_class(), cm.graph_module)
    whole = whole_model(executable, "iree", "IREE module")
    cluster = whole.cluster
    if not isinstance(cluster, IreeCluster) or cluster.vmfb is None:
        raise BackendError("the model is not one IREE module: its cluster kept no compiled module",
                           hint="export format 'pt2' keeps the whole program")
    if whole.args != list(range(whole.n_inputs)) or whole.outputs != list(range(len(whole.outputs))):
        raise BackendError("the model is not one IREE module: the module takes or returns the model's values in "
                           f"another order (inputs {whole.args}, outputs {whole.outputs})",
                           hint="export format 'onnx' names its inputs and outputs; 'pt2' keeps the whole program")
    return cluster


def header(cluster: IreeCluster, command: str | None = None, driver: str = "local-sync") -> str:
    """`//` comment lines that make an exported .mlir self-describing."""
    kind = _INPUT_TYPE[cluster.kind]
    lines = [
        "qlower export: the whole model as one IREE module "
        f"({'TOSA + linalg' if kind == 'tosa' else 'torch dialect'}, --iree-input-type={kind})",
        f"entry: @{ENTRY}(the model's inputs, in order) -> its output; uint8 tensors travel as their bytes "
        "viewed as int8 (i8); dynamic dims are `?`",
        f"compile: {command or cluster.command}",
        f"run: iree-run-module --device={driver} --module=model.vmfb --function={ENTRY} --input=@x.npy --output=@y.npy",
    ]
    return "".join(f"// {ln}\n" for ln in lines)


def retargeted(cluster: IreeCluster, target: str) -> tuple[bytes, str, str]:
    """The cluster's MLIR compiled for `target`: (vmfb, iree-compile command, runtime driver).
    A target IREE cannot compile this module for is a BackendError naming it."""
    # as the backend compiles it: never on a data-tiling path that miscompiles the cluster
    options, _ = data_tiling_for(IreeOptions.for_target(target).resolved_for(cluster.info.ops), cluster.fallback)
    input_type = _INPUT_TYPE[cluster.kind]
    try:
        compiled = compile_mlir(cluster.mlir, input_type, options)
    except Exception as exc:  # noqa: BLE001  (iree-compile's diagnostics, shortened)
        lines = [ln for ln in str(exc).splitlines() if "error:" in ln]
        raise BackendError(f"iree-compile cannot compile the model for {target!r}: "
                           f"{(lines[0] if lines else str(exc))[:300]}",
                           hint="docs/iree.md, GPU targets: the architectures IREE 3.13 knows") from exc
    return compiled.vmfb, compile_command(input_type, options), options.runtime_driver()


def export_iree(cm, path: str | Path, format: str, target: str | None = None, backend_class=None) -> Path:
    """Write the whole model's MLIR ("mlir") or compiled module ("vmfb") to `path` (atomically;
    an unwritable path is an ArtifactError); `target` compiles it for another device. A model
    compiled elsewhere is compiled by `backend_class` (IreeBackend) first."""
    path = Path(path)
    cluster = whole_model_cluster(cm, backend_class)
    if format not in ("vmfb", "mlir"):
        raise ValueError(f"unknown IREE export format {format!r}")
    if target is None:
        vmfb, command, driver = cluster.vmfb, cluster.command, cluster.driver
    else:
        vmfb, command, driver = retargeted(cluster, target)
    if format == "vmfb":
        atomic_write(path, lambda tmp: tmp.write_bytes(vmfb))
    else:
        atomic_write(path, lambda tmp: tmp.write_text(header(cluster, command, driver) + cluster.mlir))
    return path
