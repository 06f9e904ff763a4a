"""The `qlower` command line."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from . import zoo
from .api import compile as qcompile, export as qexport
from .backends import EXPORT_FORMATS, get_backend
from .bench import baseline_warnings, machine_info, ratio_lines, rich_table, run_plan, suites, write_outputs
from .bench.device_check import prepare
from .capture import load_pt2
from .demo import run_demo
from .errors import InputError, QlowerError
from .fx import schema_of
from .report.verify import verify as run_verify
from .timing import pinned_threads
from .runtime import load

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="qlower: quantization-aware compiler for PyTorch models.")
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


def _fail(exc: Exception) -> None:
    err.print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(code=2)


@app.command()
def demo(models: str = typer.Option("cnn,transformer", help="comma-separated zoo models"),
         backend: str = typer.Option("auto", help="auto (fastest correct engine, measured) | onnxruntime | openvino | "
                                     "iree | reference"),
         runs: int = typer.Option(10, help="timed runs per stack (median reported)"),
         threads: int = typer.Option(1, help="intra-op threads of eager PyTorch and the engines alike (one: "
                                     "small models' eager timings on several threads swing by 10x on shared "
                                     "machines)")):
    """Quantize, compile and run the built-in models; print accuracy and latency (eager and
    qlower timed on the same threads, their calls interleaved)."""
    names = [m.strip() for m in models.split(",") if m.strip()]
    try:
        rows = run_demo(names, backend=backend, runs=runs, threads=threads)
    except QlowerError as exc:
        _fail(exc)
    used = rows[0].threads if rows else threads
    table = Table(title=f"qlower demo: int8 vs eager fp32 (batch 1, {used} thread{'s' if used != 1 else ''} "
                        "for both, medians)")
    for col in ("model", "backend", "clusters", "fallbacks", "int conv/linear/matmul",
                "SQNR dB", "cosine", "eager ms", "qlower ms", "speed-up"):
        table.add_column(col, justify="right" if col not in ("model", "backend") else "left")
    for r in rows:
        table.add_row(r.model, r.backend, str(r.clusters), str(r.fallbacks), r.lowered,
                      f"{r.sqnr_db:.1f}", f"{r.cosine:.5f}", f"{r.eager_ms:.2f}", f"{r.qlower_ms:.2f}",
                      f"{r.speedup:.2f}x" + ("?" if r.warnings else ""))
    console.print(table)
    for r in rows:
        for line in r.warnings:
            err.print(f"[yellow]warning:[/] {line}", highlight=False)


@app.command()
def bench(models: Optional[str] = typer.Option(None, help="comma-separated zoo models (default: the suite's)"),
          stacks: Optional[str] = typer.Option(None, help="comma-separated stacks (default: the suite's)"),
          batch: Optional[str] = typer.Option(None, help="comma-separated batch sizes, e.g. 1,8 "
                                              "(default: the suite's)"),
          suite: str = typer.Option("default", help="default: small zoo models, batch 1 | quick: smoke run | "
                                    "real: MiniLM/BERT-base/ResNet-50/SmolLM2 sizes at batch 1 and 8 | "
                                    "llm: SmolLM2-135M generation against llama.cpp, ORT, OpenVINO, torchao"),
          quick: bool = typer.Option(False, help="same as --suite quick (2 models, fast stacks, 2 rounds, < 3 min)"),
          rounds: Optional[int] = typer.Option(None, help="interleaved timing rounds (default: the suite's)"),
          out: Path = typer.Option(Path("bench-out"), help="where bench.json / bench.md / bench.png / bench.log go"),
          threads: Optional[int] = typer.Option(None, help="intra-op threads of every stack, eager PyTorch included "
                                                "(default: torch's current count; stated in the output)"),
          partition_nodes: int = typer.Option(0, help="instead: time clustering a synthetic graph of N ops")):
    """Time zoo models on qlower and its peers side by side in one run (medians, ratios, accuracy).
    The terminal shows progress and the table; what libraries print or warn goes to OUT/bench.log."""
    if partition_nodes:
        from .bench import partition_scaling
        seconds, clusters = partition_scaling(partition_nodes)
        console.print(f"clustered {partition_nodes} ops into {clusters} clusters in {seconds * 1e3:.1f} ms")
        return
    try:
        chosen = suites.get("quick" if quick else suite)
        batches = tuple(int(b) for b in batch.split(",")) if batch else None
        if chosen.runner is not None:   # a suite with its own run (llm)
            split = lambda text: [t.strip() for t in text.split(",") if t.strip()] if text else None
            chosen.runner(models=split(models), stacks=split(stacks), batches=batches, rounds=rounds, out=out,
                          log=lambda m: err.print(m, markup=False), command="qlower bench " + " ".join(sys.argv[2:]))
            return
        if models:
            names = [m.strip() for m in models.split(",") if m.strip()]
            for name in names:
                zoo.get(name)   # a typo is an error before minutes of work, not a row
            plan = [(name, b) for name in names for b in (batches or chosen.batches())]
        else:
            plan = [(name, b) for name, b in chosen.plan() if batches is None or b in batches]
    except (QlowerError, ValueError) as exc:
        _fail(exc)
    stack_names = [s.strip() for s in stacks.split(",")] if stacks else list(chosen.stacks)
    out.mkdir(parents=True, exist_ok=True)
    command = "qlower bench " + " ".join(sys.argv[2:])
    try:
        with pinned_threads(threads) as used:
            machine = machine_info()
            err.print(f"qlower bench --suite {chosen.name}: {len(plan)} model/batch pairs x {len(stack_names)} "
                      f"stacks, {used} thread(s) each (eager included); library output goes to {out / 'bench.log'}",
                      markup=False)
            results = run_plan(plan, stack_names, rounds=rounds or chosen.rounds, block=chosen.block,
                               warmup=chosen.warmup, log=lambda m: err.print(m, markup=False),
                               block_ms=chosen.block_ms, log_file=out / "bench.log",
                               calibration_batches=chosen.calibration_batches,
                               canonical_inputs=chosen.canonical_inputs,
                               on_pair=lambda so_far: write_outputs(so_far, out, command, machine, chart=False))
    except QlowerError as exc:
        _fail(exc)
    console.print(rich_table(results, machine))
    for line in ratio_lines(results):
        console.print(line)
    for line in baseline_warnings(results):
        err.print(f"[yellow]warning:[/] {line}", highlight=False)
    write_outputs(results, out, command, machine)
    console.print(f"wrote {out / 'bench.json'}, {out / 'bench.md'}, {out / 'bench.png'} and {out / 'bench.log'}")


@app.command("device-check")
def device_check(out: Path = typer.Argument(..., help="the bundle's folder"),
                 iree_target: str = typer.Option("cuda:sm_80",
                                                 help="IREE target, backend[:arch] (see `qlower export`)"),
                 models: str = typer.Option(",".join(("cnn", "transformer", "transformer-blockops", "mobilenet", "vit",
                                                      "bert")),
                                            help="comma-separated zoo models"),
                 batch: int = typer.Option(8, help="the modules' (static) batch size")):
    """Compile zoo models here for an IREE device (a GPU) into a bundle that a machine with only
    numpy + iree-base-runtime checks (int8 bit-exact, fp32 within tolerance) and times:
    `python OUT/run.py OUT` there."""
    try:
        manifest = prepare(out, iree_target, [m.strip() for m in models.split(",") if m.strip()], batch,
                           progress=lambda m: err.print(m, markup=False))
    except QlowerError as exc:
        _fail(exc)
    console.print(f"wrote {len(manifest['entries'])} modules for {iree_target} to {out}; "
                  f"run there: python {out / 'run.py'} {out} --driver {manifest['driver']}")


@app.command()
def export(path: Path = typer.Argument(..., help="a .pt2 file (torch.export program, Q/DQ program or qlower artifact)"),
           out: Path = typer.Argument(..., help="output file"),
           format: str = typer.Option("onnx", help="onnx | mlir | vmfb | pt2"),
           onnx_ops: str = typer.Option("standard", help="onnx: standard (ai.onnx operators only, any ONNX consumer) "
                                        "| onnxruntime (ONNX Runtime's contrib kernels, bit-exact there) | qdq "
                                        "(Q/DQ around float ops, for consumers' int8 fusions; a compiled model only)"),
           profile: str = typer.Option("float", help="requantization profile: float | fixed (TOSA; IREE and the "
                                       "reference run it, ONNX Runtime does not); a qlower artifact keeps its own"),
           iree_target: str = typer.Option(None, help="mlir/vmfb: compile for this IREE target instead of this CPU, "
                                                      "backend[:arch]: cuda:sm_80 | rocm:gfx942 | vulkan-spirv:ampere "
                                                      "| llvm-cpu:znver4")):
    """Export a saved program as one ONNX file (standard operators by default), one IREE module
    (.mlir as emitted, or compiled .vmfb for iree-run-module, for this CPU or --iree-target's
    device) or .pt2, with the model's input and output names; says which nodes prevent it
    otherwise. A qlower artifact (CompiledModule.save) keeps its dynamic dims."""
    # the standard-op ONNX is lowered from the program whatever it was compiled for: the
    # reference backend compiles nothing; the other formats reuse their engine's compile
    backend = "reference" if format == "onnx" and onnx_ops == "standard" else EXPORT_FORMATS.get(format, "reference")
    try:
        if _is_qlower_artifact(path):
            cm = load(path)
        else:
            ep = load_pt2(path)
            example = tuple(torch_zeros_like(n.meta["val"]) for n in ep.graph.nodes
                            if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs)
            cm = qcompile(ep, example, backend=backend, profile=profile)
        qexport(cm, out, format=format, target=iree_target, onnx_ops=onnx_ops)
    except QlowerError as exc:
        _fail(exc)
    console.print(f"wrote {out}")


def _is_qlower_artifact(path: Path) -> bool:
    """The file is a .pt2 written by CompiledModule.save (it holds qlower's metadata part)."""
    import zipfile
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("extra/qlower.json") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def torch_zeros_like(val):
    import torch
    return torch.zeros(tuple(d if isinstance(d, int) else 1 for d in val.shape), dtype=val.dtype)


@app.command()
def inspect(path: Path = typer.Argument(..., help="a .pt2 file (torch.export program or qlower artifact)")):
    """Print the graph of a .pt2 file and, for a qlower artifact, its compile report."""
    try:
        cm = load(path)
        console.print(str(cm.report()), markup=False)
        console.print(str(cm.graph_module.graph), markup=False)
    except QlowerError:
        from .capture import load_pt2
        try:
            console.print(str(load_pt2(path).graph), markup=False)
        except QlowerError as exc:
            _fail(exc)


@app.command()
def schema(path: Path = typer.Argument(..., help="a .pt2 file (torch.export program or qlower artifact)"),
           backend: str = typer.Option("onnxruntime", help="whose capability to check")):
    """Print each call node's full op schema and whether (and why not) the backend supports it."""
    try:
        ep = load_pt2(path)
        cap = get_backend(backend).capability
    except QlowerError as exc:
        _fail(exc)
    gm = ep.module()
    unsupported = 0
    for node in gm.graph.nodes:
        if node.op == "call_function":
            why = cap.why_not(node)
            unsupported += why is not None
            status = "supported" if why is None else f"NOT supported: {why}"
            console.print(f"{node.name}: {schema_of(node)}\n    {backend}: {status}", markup=False)
    console.print(f"{unsupported} node(s) not supported by {backend}", markup=False)


@app.command()
def ops(backend: str = typer.Option("onnxruntime", help="onnxruntime | openvino | iree | reference")):
    """List the op schemas a backend accepts and the condition on each
    (QLOWER_OP_ALLOWLIST / QLOWER_OP_DENYLIST adjust it)."""
    try:
        cap = get_backend(backend).capability
    except QlowerError as exc:
        _fail(exc)
    table = Table(title=f"{backend} capability",
                  caption="an op this backend does not accept runs in PyTorch, with its reason in the compile "
                          "report (`qlower schema FILE.pt2` lists it per node)")
    table.add_column("op schema")
    table.add_column("condition")
    for name, note in cap.table():
        table.add_row(name, note)
    console.print(table)


@app.command()
def verify(model: str = typer.Argument(..., help="a zoo model name (qlower.zoo) or a float .pt2 program"),
           quantize: str = typer.Option("int8", help="preset: int8, transformer, int8-symmetric, int8-7bit-weights"),
           out: Path = typer.Option(Path("verify.html"), help="the HTML report (one self-contained file)"),
           inputs: int = typer.Option(4, help="evaluation inputs (zoo / random: seeds 1000...)"),
           calibration: int = typer.Option(8, help="calibration batches (zoo / random: seeds 100...)"),
           batch: int = typer.Option(1, help="batch size of generated inputs"),
           data: Optional[Path] = typer.Option(None, help="torch.save'd list of input tuples to evaluate on"),
           calibration_data: Optional[Path] = typer.Option(None, help="torch.save'd list of input tuples to "
                                                           "calibrate on (default: --data, else generated)"),
           suggest: int = typer.Option(3, help="how many of the worst layers' modules to try in float"),
           json_out: Optional[Path] = typer.Option(None, "--json", help="also write the report as JSON"),
           charts: Optional[Path] = typer.Option(None, help="also write the two charts as SVG files into this "
                                                 "folder (<out stem>-layer-sqnr.svg, "
                                                 "<out stem>-activation-ranges.svg)"),
           top: int = typer.Option(10, help="layers printed here (the HTML has all)")):
    """Float vs quantized on the same inputs: per-layer SQNR (worst first), activation outlier
    statistics, measured suggestions (layers to keep float, SmoothQuant), one HTML report."""
    import json
    import warnings

    import logging

    logging.getLogger("torch.utils._pytree").addFilter(lambda r: "is an Enum subclass" not in r.getMessage())
    progress = _progress_line()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            target, name, eval_inputs, calib, note = _verify_inputs(model, inputs, calibration, batch, data,
                                                                     calibration_data)
            report = run_verify(target, eval_inputs, calib, quantize, suggest=suggest, name=name, progress=progress)
    except QlowerError as exc:
        progress(None)
        _fail(exc)
    progress(None)
    if note:
        report.notes.append(note)
    report.save_html(out)
    written = [out]
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report.to_dict(), indent=1))
        written.append(json_out)
    if charts is not None:
        from .report.html import charts as chart_svgs
        charts.mkdir(parents=True, exist_ok=True)
        for kind, svg in chart_svgs(report).items():
            path = charts / f"{out.stem}-{kind}.svg"
            path.write_text(svg)
            written.append(path)
    console.print(report.summary(top=top), markup=False, highlight=False, soft_wrap=True)
    console.print("wrote " + ", ".join(str(p) for p in written), markup=False, highlight=False, soft_wrap=True)


def _progress_line():
    """One status line on stderr, rewritten in place on a terminal; nothing otherwise."""
    def show(message):
        if not err.is_terminal:
            return
        err.file.write("\r\033[K" + (f"qlower verify: {message}..." if message else ""))
        err.file.flush()
    return show


def _verify_inputs(model: str, inputs: int, calibration: int, batch: int, data, calibration_data):
    """(model or program, display name, evaluation inputs, calibration, note) for `qlower verify`."""
    import torch


    def load(path: Path) -> list:
        try:
            loaded = torch.load(path, weights_only=True)
        except Exception as exc:
            raise InputError(f"could not read {path}: {exc}",
                             hint="torch.save a list of input tuples, e.g. torch.save([(x1,), (x2,)], path)")
        return [x if isinstance(x, (tuple, list)) else (x,) for x in (loaded if isinstance(loaded, list) else [loaded])]

    given = load(data) if data else None
    calib = load(calibration_data) if calibration_data else given
    if model in zoo.ZOO:
        entry = zoo.get(model)
        evals = given or [entry.inputs(batch, seed=1000 + i) for i in range(inputs)]
        return entry.model(), model, evals, calib or entry.calibration(calibration, batch), None
    path = Path(model)
    if not (path.suffix == ".pt2" or path.exists()):
        raise QlowerError(f"{model!r} is neither a zoo model nor a .pt2 file", hint=f"zoo models: {sorted(zoo.ZOO)}")
    ep = load_pt2(path)
    note = None
    if given is None or calib is None:
        vals = [n.meta["val"] for n in ep.graph.nodes
                if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs]
        if any(not v.dtype.is_floating_point for v in vals):
            raise InputError("this program takes integer inputs; random ones would mean nothing",
                             hint="pass --data (and --calibration-data) with torch.save'd input tuples")

        def generated(seed: int) -> tuple:
            gen = torch.Generator().manual_seed(seed)
            return tuple(torch_zeros_like(v).normal_(generator=gen) for v in vals)  # symbolic dims: 1
        note = "inputs are random N(0, 1) tensors: pass --data / --calibration-data for representative ones"
        given = given or [generated(1000 + i) for i in range(inputs)]
        calib = calib or [generated(100 + i) for i in range(calibration)]
    return ep, path.stem, given, calib, note


def main(argv: Optional[list[str]] = None) -> None:
    app(args=argv)


if __name__ == "__main__":
    main(sys.argv[1:])
