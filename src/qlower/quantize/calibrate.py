"""Calibration: feed input tuples through an observed model, with a progress bar on a TTY."""
from __future__ import annotations

from collections.abc import Iterable

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..capture import check_example_inputs
from ..errors import QuantizeError


def calibrate(observed: torch.nn.Module, calibration: Iterable, *, console: Console | None = None) -> int:
    """Run every calibration batch; returns how many ran. Raises if there were none."""
    console = console or Console(stderr=True)
    batches = list(calibration) if not hasattr(calibration, "__len__") else calibration
    total = len(batches)
    if total == 0:
        raise QuantizeError("calibration data is empty", hint="pass at least one input tuple")
    columns = (TextColumn("calibrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("calibrate", total=total)
        with torch.no_grad():
            for i, batch in enumerate(batches):
                try:
                    inputs = check_example_inputs(batch)
                except Exception as exc:
                    raise QuantizeError(f"calibration batch {i} is not an input tuple: {exc}",
                                        hint="calibration must yield tuples like the example inputs") from exc
                observed(*inputs)
                bar.advance(task)
    return total
