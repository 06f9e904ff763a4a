"""Capture: `torch.export` with qlower's error reporting, and .pt2 load/save."""
from __future__ import annotations

import contextlib
import functools
import inspect
import re
import threading
from pathlib import Path

import torch

from .errors import ArtifactError, CaptureError, InputError
from .artifact import read_pt2, write_pt2
from .input_spec import storage_hint, storage_problem

# torch.export, dynamo and the tracing qlower's passes and quantizer do keep global state (the
# dispatch mode stack, export's module hierarchy, fake modes): two threads capturing at once
# corrupt each other (measured: "Trying to pop empty mode stack", "_EXPORT_MODULE_HIERARCHY must
# not be None" in every round of 4 threads). compile / quantize / capture / load take this lock,
# re-entrant (compile captures), so they are safe from several threads and run one at a time;
# calling a compiled model does not take it.
COMPILE_LOCK = threading.RLock()
# compiles auto abandoned at its time budget, still running in their threads (engine_choice): the
# next outermost entry waits for them, so they never run beside another compile's tracing
_LEFT_RUNNING: list[threading.Thread] = []
_DEPTH = threading.local()


def leave_running(worker: threading.Thread) -> None:
    """Record a compile left running past auto's budget (see _LEFT_RUNNING)."""
    _LEFT_RUNNING.append(worker)


def serialized(fn):
    """`fn` holding COMPILE_LOCK; an outermost call first waits (without the lock, which such a
    compile never takes) for the compiles left running."""
    @functools.wraps(fn)
    def locked(*args, **kwargs):
        depth = getattr(_DEPTH, "n", 0)
        while True:
            while depth == 0 and _LEFT_RUNNING:
                worker = _LEFT_RUNNING[0]
                worker.join()
                with contextlib.suppress(ValueError):   # another thread may have removed it
                    _LEFT_RUNNING.remove(worker)
            COMPILE_LOCK.acquire()
            if depth > 0 or not _LEFT_RUNNING:
                break
            COMPILE_LOCK.release()   # one was left running meanwhile: wait for it too
        _DEPTH.n = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _DEPTH.n = depth
            COMPILE_LOCK.release()
    return locked


_SOURCE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_OP_NAME = re.compile(r"\b((?:aten|qlower|prims|quantized_decomposed)::?\.?[\w.]+|torch\.ops\.[\w.]+)")


def check_example_inputs(example_inputs) -> tuple:
    """Normalise `example_inputs` to a tuple; a bare tensor is a common mistake worth a hint."""
    if isinstance(example_inputs, torch.Tensor):
        raise InputError("example_inputs must be a tuple of inputs, got a bare tensor",
                         hint="pass (x,) instead of x")
    if not isinstance(example_inputs, (tuple, list)):
        raise InputError(f"example_inputs must be a tuple, got {type(example_inputs).__name__}",
                         hint="pass the positional inputs of forward() as a tuple, e.g. (x,)")
    leaves = torch.utils._pytree.tree_leaves(tuple(example_inputs))
    for index, value in enumerate(leaves):
        problem = storage_problem(value) if isinstance(value, torch.Tensor) else None
        if problem:   # torch.export would fail on a device mix, or capture a sparse program no engine runs
            raise InputError(f"example input {index} {problem}", hint=storage_hint(value))
    return tuple(example_inputs)


def check_module(model) -> None:
    if isinstance(model, torch.export.ExportedProgram):
        return
    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"expected a torch.nn.Module or ExportedProgram, got {type(model).__name__}",
                           hint="wrap plain functions in an nn.Module whose forward() calls them")
    _check_materialized(model)


@contextlib.contextmanager
def eval_mode(model):
    """`model` (and every submodule) in eval mode inside; afterwards each submodule's `training`
    flag is what it was, also when the body raises: compiling must not leave a training loop's
    model without dropout. An ExportedProgram is left alone."""
    if not isinstance(model, torch.nn.Module):
        yield
        return
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training


def _check_materialized(model: torch.nn.Module) -> None:
    """Parameters on the meta device have no values: compiling them would bake in garbage or
    fail deep inside a backend."""
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    name = next((n for n, t in tensors if t is not None and t.is_meta), None)
    if name is not None:
        raise CaptureError(f"'{name}' is on the meta device (it has no values)",
                           hint="materialize the weights first: model.to_empty(device='cpu') then load a "
                                "state_dict, or load_state_dict(..., assign=True)")


def _describe_export_failure(exc: BaseException) -> tuple[str, str | None, str | None]:
    """One-line cause, offending op and user source line extracted from torch's message."""
    text = str(exc)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    user_lines = [f"{f}:{ln}" for f, ln in _SOURCE_LINE.findall(text)
                  if "/torch/" not in f and "/site-packages/" not in f]
    ops = _OP_NAME.findall(text)
    return first[:300], (ops[0] if ops else None), (user_lines[-1] if user_lines else None)


def _constraint_violation(text: str, dynamic_shapes=None) -> tuple[str, str] | None:
    """(cause, hint) for torch.export's "Constraints violated" error: which declared range the
    model does not support and torch's suggested Dim — its first line alone ("Constraints
    violated (seq)!") named neither (a BERT whose position table holds 512 ids, declared up to
    1024 tokens). Where torch suggests nothing (MobileBERT's guard `seq - 1 != 1`), the guard is
    evaluated over the declared range and the sizes it excludes are named."""
    if "Constraints violated" not in text:
        return None
    lines = [ln.strip() for ln in text.splitlines()]
    why = [ln.lstrip("- ") for ln in lines if ln.startswith("- ")]
    fixes = []
    if "Suggested fixes:" in lines:
        for ln in lines[lines.index("Suggested fixes:") + 1:]:
            if not ln:
                break
            fixes.append(ln)
    if not fixes:
        fixes = [fix for fix in map(lambda w: _range_fix(w, dynamic_shapes), why) if fix]
    cause = "; ".join(why) or lines[0]
    hint = ("declare what the model supports: " + "; ".join(fixes)) if fixes else \
        "narrow the declared Dim ranges to the sizes the model supports"
    return f"the declared dynamic shapes do not hold: {cause}"[:600], hint


_GUARD = re.compile(r"Not all values of (\w+) = (.+?) in the specified range .*? satisfy the generated guard (.+?)\.?$")
_MAX_SIZES_TRIED = 65536


def _declared_dims(dynamic_shapes) -> dict[str, tuple[int, int]]:
    """name -> (min, max) of every torch.export.Dim in a dynamic_shapes structure."""
    def is_dim(v) -> bool:
        return all(hasattr(v, a) for a in ("__name__", "min", "max"))
    leaves = torch.utils._pytree.tree_leaves(dynamic_shapes, is_leaf=is_dim)
    return {leaf.__name__: (int(leaf.min), int(leaf.max)) for leaf in leaves if is_dim(leaf)}


_GUARD_FUNCTIONS = {"Eq": lambda a, b: a == b, "Ne": lambda a, b: a != b, "Mod": lambda a, b: a % b,
                    "FloorDiv": lambda a, b: a // b, "Max": max, "Min": min}


def _guard_predicate(text: str, name: str):
    """size -> bool for a guard as torch prints it (`seq != 2`, `(seq % 2) == 0`,
    `3 <= seq and seq <= 64`, `Eq(Mod(seq, 2), 0)`): arithmetic, comparisons and boolean
    operators on one size and integer constants, read as a Python expression tree (anything else,
    ValueError)."""
    import ast
    import operator as op
    binary = {ast.Add: op.add, ast.Sub: op.sub, ast.Mult: op.mul, ast.FloorDiv: op.floordiv, ast.Mod: op.mod}
    compare = {ast.Eq: op.eq, ast.NotEq: op.ne, ast.Lt: op.lt, ast.LtE: op.le, ast.Gt: op.gt, ast.GtE: op.ge}
    tree = ast.parse(text.strip(), mode="eval").body

    def value(node, size: int):
        if isinstance(node, ast.Name) and node.id == name:
            return size
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, bool)):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
            v = value(node.operand, size)
            return -v if isinstance(node.op, ast.USub) else not v
        if isinstance(node, ast.BinOp) and type(node.op) in binary:
            return binary[type(node.op)](value(node.left, size), value(node.right, size))
        if isinstance(node, ast.BoolOp):
            vals = [bool(value(v, size)) for v in node.values]
            return all(vals) if isinstance(node.op, ast.And) else any(vals)
        if isinstance(node, ast.Compare) and all(type(o) in compare for o in node.ops):
            left, result = value(node.left, size), True
            for o, right_node in zip(node.ops, node.comparators):
                right = value(right_node, size)
                result, left = result and compare[type(o)](left, right), right
            return result
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _GUARD_FUNCTIONS:
            return _GUARD_FUNCTIONS[node.func.id](*(value(a, size) for a in node.args))
        raise ValueError(f"guard term {ast.dump(node)[:80]} not read")

    return lambda size: bool(value(tree, size))


def _range_fix(why: str, dynamic_shapes) -> str | None:
    """`Dim('seq', min=3, max=64)` when the sizes a guard excludes lie at the ends of the declared
    range, else the excluded sizes; None when the guard cannot be evaluated."""
    m = _GUARD.search(why)
    if m is None:
        return None
    name, source, guard = m.groups()
    bounds = _declared_dims(dynamic_shapes).get(name)
    if bounds is None or bounds[1] - bounds[0] >= _MAX_SIZES_TRIED:
        return None
    try:
        holds = _guard_predicate(guard.replace(source, name), name)
        ok = [v for v in range(bounds[0], bounds[1] + 1) if holds(v)]
    except (SyntaxError, ValueError, ArithmeticError):   # a guard form not read here: torch's text stays
        return None
    if not ok:
        return f"no size of {name} in [{bounds[0]}, {bounds[1]}] satisfies {guard}"
    if ok == list(range(ok[0], ok[-1] + 1)):
        return f"Dim('{name}', min={ok[0]}, max={ok[-1]})"
    excluded = sorted(set(range(bounds[0], bounds[1] + 1)) - set(ok))
    return f"{name} must not be {', '.join(map(str, excluded[:8]))}{', ...' if len(excluded) > 8 else ''}"


def _hint_for(exc: BaseException) -> str:
    """The fix depends on why export failed: a branch on a tensor's value, a dtype mismatch
    between inputs and weights, or an op export cannot trace."""
    text = f"{type(exc).__name__}: {exc}".lower()
    if "pendingunbackedsymbolnotfound" in text or "pending unbacked symbols" in text:
        # measured: torch.narrow(x, 0, start_tensor, 2) fails in plain torch.export as well
        return ("torch.export loses a size or offset read from a tensor's value here (a narrow whose start "
                "is a tensor, a length from .item()): pass it as a Python int, or select the rows with "
                "torch.index_select or a mask instead")
    if "data-dependent" in text or "datadependent" in text or "guardondatadependent" in text:
        return ("Python control flow on a tensor's value cannot be captured: use torch.cond(pred, "
                "true_fn, false_fn, operands) or torch.where, or make the condition a constant")
    if ("dtype" in text or "scalar type" in text or "input type" in text) and \
            any(w in text for w in ("same", "expected", "mismatch")):
        return "the example inputs' dtypes must be the ones the model computes in (e.g. x.float() for a float model)"
    return "rewrite the unsupported code path, or wrap it in a torch.library custom op"


@serialized
def capture(model, example_inputs, dynamic_shapes=None, *, strict: bool = False
            ) -> torch.export.ExportedProgram:
    """torch.export the model (eval mode) into an ExportedProgram of core ATen + qlower ops.
    An ExportedProgram is returned unchanged."""
    check_module(model)
    if isinstance(model, torch.export.ExportedProgram):
        return model
    example_inputs = check_example_inputs(example_inputs)
    _check_positional_forward(model, example_inputs)
    with eval_mode(model):
        ep = _export(model, example_inputs, dynamic_shapes, strict)
    _check_operand_dtypes(ep)
    return ep


@serialized
def capture_again(gm: torch.fx.GraphModule, example_inputs: tuple, dynamic_shapes=None) -> torch.export.ExportedProgram:
    """torch.export a rewritten program's module (the quantizer's converted graph) into a
    self-contained program, with capture's typed errors (no train/eval switch: an exported
    module has none)."""
    return _export(gm, example_inputs, dynamic_shapes, False)


def _export(model, example_inputs, dynamic_shapes, strict: bool) -> torch.export.ExportedProgram:
    try:
        return torch.export.export(model, example_inputs, dynamic_shapes=dynamic_shapes, strict=strict)
    except Exception as exc:  # torch raises many types; all mean "could not capture"
        cause, op, source = _describe_export_failure(exc)
        hint = _hint_for(exc)
        violation = _constraint_violation(str(exc), dynamic_shapes)
        if violation is not None:
            cause, hint = violation
        raise CaptureError(f"torch.export could not capture {type(model).__name__}: {cause}",
                           schema=op, source=source, hint=hint) from exc


def _check_positional_forward(model: torch.nn.Module, example_inputs: tuple) -> None:
    """example_inputs are passed to forward() positionally: a forward whose parameters are
    keyword-only (`def forward(self, *, x)`) or that takes fewer of them cannot be called so.
    Say that, rather than torch.export's "rewrite the unsupported code path"."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):   # no Python signature to check: let torch.export decide
        return
    try:
        signature.bind(*example_inputs)
    except TypeError as exc:
        keyword_only = [p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
        fix = f"{', '.join(keyword_only)} positional parameters" if keyword_only else "their number match forward()"
        hint = (f"example_inputs are passed to forward() positionally: make {fix}"
                + ", or wrap the model in a module whose forward(self, ...) calls it with keywords")
        raise CaptureError(f"{type(model).__name__}.forward{signature} cannot take the {len(example_inputs)} "
                           f"example input(s) positionally: {exc}", hint=hint) from exc


_SAME_DTYPE_OPS = ("linear", "addmm", "mm", "bmm", "matmul", "conv1d", "conv2d", "conv3d", "convolution",
                   "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")


def _check_operand_dtypes(ep: torch.export.ExportedProgram) -> None:
    """Fake-tensor tracing accepts e.g. an int64 input to a float32 linear; it would fail only
    when run. Refuse it at capture, naming the node and the user's source line."""
    for node in ep.graph.nodes:
        packet = getattr(node.target, "overloadpacket", None)
        if node.op != "call_function" or getattr(packet, "__name__", None) not in _SAME_DTYPE_OPS:
            continue
        vals = [a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)]
        dtypes = sorted({str(v.dtype).removeprefix("torch.") for v in vals if isinstance(v, torch.Tensor)})
        if len(dtypes) > 1:
            trace = node.meta.get("stack_trace") or ""
            lines = [f"{f}:{ln}" for f, ln in _SOURCE_LINE.findall(trace) if "/torch/" not in f]
            raise CaptureError(f"{packet.__name__} mixes operand dtypes {' and '.join(dtypes)}",
                               node=node.name, schema=f"aten::{packet.__name__}", source=lines[-1] if lines else None,
                               hint="the example inputs' dtypes must be the ones the model computes in "
                                    "(e.g. x.float() for a float model)")


@serialized
def save_pt2(ep: torch.export.ExportedProgram, path: str | Path) -> Path:
    """Write a program as a .pt2 that torch.export.load reads too, atomically and with a sha256
    manifest (the sample inputs, a pickle, are left out)."""
    return write_pt2(ep, path)


@serialized
def load_pt2(path: str | Path) -> torch.export.ExportedProgram:
    """A torch.export program from a .pt2 file, without unpickling or running anything in it
    (artifact/__init__.py): files of other tools load when they hold plain tensors, else a typed
    ArtifactError names the refused part. A manifest, when present, is verified."""
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"no such .pt2 file: {path}", hint="check the path")
    return read_pt2(path, require_manifest=False)[0]
