"""Calibration: feed input tuples through an observed model, with a progress bar on a TTY.

What `calibration=` accepts: any iterable of batches (a list, a generator, a torch DataLoader),
or `Calibration(data, transform=fn)` for batches that are not yet the model's inputs (a
DataLoader's `[images, labels]`, a dict of features), like `nncf.Dataset(loader, transform_fn)`.
A batch is an input tuple, or a bare tensor for a one-input model. Batches may have any batch
size: where the model's dim 0 is static (no `dynamic_shapes` for it), a batch of another size
is cut into pieces of the example's size along dim 0 (`fit_batches`), rows of the last piece
wrapping around to the batch's first rows when it does not divide; observers see every row.

Every batch is checked before it runs (a tuple of tensors matching the example inputs' dtypes
and static dims, all finite) so that a bad sample is reported as a QuantizeError naming the batch
and input, not as a guard assertion or an observer's "min nan should be less than max nan".
Batches holding NaN/inf are rejected, not skipped: observers would record a NaN/inf range, and
silently dropping samples would change the calibration the user asked for."""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable

import torch
from torch.fx import Node
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..capture import check_example_inputs
from ..core import progress
from ..errors import QlowerError, QuantizeError
from ..fx import schema_name, source_of
from ..input_spec import input_specs_of

_HINT = ("calibration must yield input tuples like the example inputs, e.g. [(x1,), (x2,)]; for a data loader "
         "whose batches are something else (e.g. [images, labels]) pass "
         "qlower.Calibration(loader, transform=lambda batch: (batch[0],))")


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Calibration data with a transform, like `nncf.Dataset(loader, transform_fn)`:
    `compile(..., calibration=qlower.Calibration(loader, transform=lambda b: (b[0],)))`.

    data:      any iterable of batches (a torch DataLoader, a list, a generator), read once.
    transform: batch -> the model's inputs (a tuple, or a tensor for a one-input model); None
               takes each batch as it is.
    batches:   read at most this many batches (None: all of them)."""
    data: Iterable
    transform: Callable | None = None
    batches: int | None = None

    def __post_init__(self):
        if self.transform is not None and not callable(self.transform):
            raise QuantizeError(f"Calibration transform must be callable, got {type(self.transform).__name__}",
                                hint="pass a function batch -> input tuple, e.g. transform=lambda b: (b[0],)")
        if self.batches is not None and (isinstance(self.batches, bool) or not isinstance(self.batches, int)
                                         or self.batches < 1):
            raise QuantizeError(f"Calibration batches must be a positive integer or None, got {self.batches!r}")
        if isinstance(self.data, torch.Tensor):
            raise QuantizeError("Calibration data is a bare tensor (iterating it would feed its rows)",
                                hint="pass an iterable of batches, e.g. a DataLoader or [(x,)]")

    def read(self) -> list:
        """The batches, transformed; typed errors for data or a transform that raises."""
        try:
            iterator = iter(self.data)
        except TypeError:
            raise QuantizeError(f"Calibration data must be an iterable of batches, got {type(self.data).__name__}",
                                hint=_HINT) from None
        out = []
        for i in itertools.count():
            if self.batches is not None and i >= self.batches:
                break
            try:
                batch = next(iterator)
            except StopIteration:
                break
            except QlowerError:
                raise
            except Exception as exc:  # a data loader that raises
                raise QuantizeError(f"the calibration data raised {type(exc).__name__}: {str(exc)[:200]}",
                                    hint="the calibration iterable itself failed while producing batches") from exc
            if self.transform is not None:
                try:
                    batch = self.transform(batch)
                except QlowerError:
                    raise
                except Exception as exc:
                    raise QuantizeError(f"the calibration transform raised {type(exc).__name__} on batch {i}: "
                                        f"{str(exc)[:200]}",
                                        hint="transform must map one batch of the data to the model's inputs "
                                             "(a tuple, or a tensor for a one-input model)") from exc
            out.append(batch)
        return out


def calibrate(observed: torch.nn.Module, calibration: Iterable, *, console: Console | None = None) -> int:
    """Run every calibration batch; returns how many ran. Raises if there were none."""
    console = console or Console(stderr=True)
    batches = _batches(calibration)
    total = len(batches)
    if total == 0:
        raise QuantizeError("calibration data is empty", hint="pass at least one input tuple")
    specs = _specs(observed)
    shared = progress.active()    # inside compile: its one display line, not a second one
    columns = (TextColumn("calibrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    disable = shared is not None or not console.is_terminal
    with Progress(*columns, console=console, transient=True, disable=disable) as bar:
        task = bar.add_task("calibrate", total=total)
        with torch.no_grad():
            for i, batch in enumerate(batches):
                if shared is not None:
                    shared.detail(f"calibrating, batch {i + 1} of {total}")
                inputs = _checked_batch(i, batch, specs)
                try:
                    observed(*inputs)
                except Exception as exc:  # the model itself failed on this sample
                    raise QuantizeError(f"calibration batch {i} failed in the model: {type(exc).__name__}: "
                                        f"{str(exc).splitlines()[0][:200] if str(exc) else ''}", hint=_HINT) from exc
                bar.advance(task)
    if shared is not None:
        shared.detail("quantizing (converting the calibrated model)")
    _check_observed_ranges(observed)
    return total


def _check_observed_ranges(observed: torch.nn.Module) -> None:
    """Finite inputs can still give a non-finite activation (a max-pool window that lies in
    the padding is -inf; a norm of it is NaN). Its observer then holds a NaN/inf range, which
    would fail later inside convert as "min nan should be less than max nan" (found by the fuzz
    run). Name the value instead: the node an observer watches and its source line."""
    modules = dict(observed.named_modules())
    for node in observed.graph.nodes:
        obs = modules.get(node.target) if node.op == "call_module" else None
        lo, hi = getattr(obs, "min_val", None), getattr(obs, "max_val", None)
        if not (isinstance(lo, torch.Tensor) and isinstance(hi, torch.Tensor) and lo.numel()):
            continue
        # (+inf, -inf) is an observer that saw no element (zero-size tensors): convert uses defaults
        if not bool((lo.isnan() | hi.isnan() | (lo == float("-inf")) | (hi == float("inf"))).any()):
            continue
        # an observer shared by range-preserving ops (max_pool, reshape) watches several values
        values = [n.args[0] for n in observed.graph.nodes if n.op == "call_module" and modules.get(n.target) is obs
                  and n.args and isinstance(n.args[0], Node)] or [node]
        value = values[-1]
        raise QuantizeError(f"the float model computes a non-finite value at {', '.join(repr(v.name) for v in values)} "
                            f"(one observed range [{lo.min().item()}, {hi.max().item()}]) on the calibration data",
                            node=value.name, schema=schema_name(value) if value.op == "call_function" else None,
                            source=source_of(value),
                            hint="a NaN or inf activation cannot be quantized: check the model on these inputs "
                                 "(e.g. a pooling window entirely in the padding gives -inf)")


def prepare_calibration(calibration, example_inputs) -> list:
    """The calibration data as a list of checked input tuples, before anything runs on it (also
    before float rewrites such as SmoothQuant read it): typed errors for a non-iterable, a
    generator that raises, a batch that is not a tuple, whose inputs differ from the example
    inputs in number, dtype or rank, or that holds NaN/inf. Static dims are checked against the
    observed graph in `calibrate` (dynamic_shapes decide which dims may vary)."""
    batches = _batches(calibration)
    if len(batches) == 0:
        raise QuantizeError("calibration data is empty", hint="pass at least one input tuple")
    examples = [t for t in torch.utils._pytree.tree_leaves(check_example_inputs(example_inputs))]
    specs = [_LooseSpec(t) for t in examples] if all(isinstance(t, torch.Tensor) for t in examples) else []
    return [_checked_batch(i, batch, specs) for i, batch in enumerate(batches)]


def fit_batches(batches: list, specs: list) -> list:
    """Batches of another size than the model's static dim 0, cut to it: for each batch whose
    tensor inputs differ from `specs` (the program's inputs) only in a static dim 0, and all
    such inputs by the same row count N against the same static size B, ceil(N / B) batches of
    B rows each (the last one's missing rows taken from the batch's first rows); inputs that
    already match are passed to every piece as they are. Any other batch is returned unchanged
    (the checks then name what does not fit)."""
    specs = [dataclasses.replace(s, bounds=()) for s in specs]   # dynamic ranges are export's to check
    any_rows = [dataclasses.replace(s, shape=(None, *s.shape[1:])) if s.shape else s for s in specs]
    out = []
    for i, batch in enumerate(batches):
        for piece in _fit(batch, specs):
            _checked_batch(i, piece, any_rows)   # first what no cutting can mend, named in the user's numbering
            out.append(_checked_batch(i, piece, specs))
    return out


def _fit(batch, specs: list) -> list:
    leaves, tree = torch.utils._pytree.tree_flatten(batch)
    if len(leaves) != len(specs) or not all(isinstance(v, torch.Tensor) for v in leaves):
        return [batch]
    cut: dict[int, tuple[int, int]] = {}    # input -> (rows N, static size B)
    for j, (spec, value) in enumerate(zip(specs, leaves)):
        shape = spec.shape
        if value.dim() != len(shape) or value.dim() == 0 or shape[0] is None or value.shape[0] == shape[0]:
            continue
        if any(want is not None and want != got for want, got in zip(shape[1:], value.shape[1:])):
            return [batch]
        cut[j] = (value.shape[0], shape[0])
    if not cut or len(set(cut.values())) != 1:
        return [batch]
    (rows, size), = set(cut.values())
    if rows == 0 or size == 0:
        return [batch]
    pieces = []
    for start in range(0, rows, size):
        index = torch.arange(start, start + size) % rows   # wraps around in the last piece only
        piece = [(v[start:start + size] if start + size <= rows else v.index_select(0, index)) if j in cut else v
                 for j, v in enumerate(leaves)]
        pieces.append(torch.utils._pytree.tree_unflatten(piece, tree))
    return pieces


def user_input_specs(ep: torch.export.ExportedProgram) -> list:
    """The specs of an exported program's user inputs (not its parameters and buffers)."""
    user = set(ep.graph_signature.user_inputs)
    specs = input_specs_of(ep.graph_module, ep.range_constraints)
    names = [n.name for n in ep.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)]
    return [s for s, name in zip(specs, names) if name in user]


class _LooseSpec:
    """What an example input fixes for every calibration batch: dtype and rank (dims may be
    dynamic)."""

    def __init__(self, example: torch.Tensor):
        self.name, self.dtype, self.rank = "", example.dtype, example.dim()

    def problem(self, value) -> str | None:
        if not isinstance(value, torch.Tensor):
            return f"expected a tensor, got {type(value).__name__}"
        if value.dtype != self.dtype:
            return (f"expected dtype {str(self.dtype).removeprefix('torch.')}, "
                    f"got {str(value.dtype).removeprefix('torch.')}")
        if value.dim() != self.rank:
            return f"expected rank {self.rank}, got shape {list(value.shape)}"
        return None


def _batches(calibration) -> list:
    """The calibration data as a list; typed errors for what cannot be one."""
    if isinstance(calibration, Calibration):
        return calibration.read()
    if isinstance(calibration, torch.Tensor):
        raise QuantizeError("calibration is a bare tensor (iterating it would feed its rows)",
                            hint="pass a list of input tuples, e.g. [(x,)] or [(x[i:i+1],) for i in range(n)]")
    if hasattr(calibration, "__len__") and hasattr(calibration, "__getitem__"):
        return calibration
    try:
        iterator = iter(calibration)
    except TypeError:
        raise QuantizeError(f"calibration must be an iterable of input tuples, got {type(calibration).__name__}",
                            hint=_HINT) from None
    try:
        return list(iterator)
    except QlowerError:
        raise
    except Exception as exc:  # a generator / data loader that raises
        raise QuantizeError(f"the calibration data raised {type(exc).__name__}: {str(exc)[:200]}",
                            hint="the calibration iterable itself failed while producing batches; fix it "
                                 "or pass a list") from exc


def _specs(observed: torch.nn.Module) -> list:
    """The observed graph's inputs (dtype, static dims); dynamic ranges are export's to check."""
    if not isinstance(observed, torch.fx.GraphModule):
        return []
    return [dataclasses.replace(s, bounds=()) for s in input_specs_of(observed)]


def _checked_batch(i: int, batch, specs: list) -> tuple:
    if isinstance(batch, torch.Tensor):   # a one-input model's batch, as a DataLoader yields it
        batch = (batch,)
    try:
        inputs = check_example_inputs(batch)
    except QlowerError as exc:
        raise QuantizeError(f"calibration batch {i} is not an input tuple: {exc.cause}", hint=_HINT) from exc
    leaves = torch.utils._pytree.tree_leaves(inputs)
    tensors_only = all(isinstance(v, torch.Tensor) for v in leaves)
    if specs and tensors_only and len(leaves) != len(specs):
        raise QuantizeError(f"calibration batch {i} has {len(leaves)} input(s), the model takes {len(specs)}",
                            hint=_HINT)
    for j, (spec, value) in enumerate(zip(specs if tensors_only else [], leaves)):
        problem = spec.problem(value)
        if problem:
            label = f" ('{spec.name}')" if spec.name else ""
            raise QuantizeError(f"calibration batch {i}, input {j}{label}: {problem}",
                                hint="calibration batches must match the example inputs' dtypes and static dims "
                                     "(declare varying dims with dynamic_shapes=)")
    for j, value in enumerate(leaves):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise QuantizeError(f"calibration batch {i}, input {j} holds NaN/inf",
                                hint="remove or clean such samples (torch.nan_to_num): observers would record "
                                     "a NaN/inf range")
    return inputs
