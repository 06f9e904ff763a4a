"""What compile shows on a terminal while it works: one spinner line on stderr naming the
current phase ("quantizing for onnxruntime", "compiling for iree", "timing openvino"), shown
only when stderr is a terminal and only once a phase has lasted `delay` seconds (a quick compile
prints nothing), removed when the call returns. Calibration reports its batches through the
active display (`active()`) instead of drawing a second one."""
from __future__ import annotations

import contextvars
import threading
import time

from rich.console import Console

_ACTIVE: contextvars.ContextVar["PhaseProgress | None"] = contextvars.ContextVar("qlower_progress", default=None)


def active() -> "PhaseProgress | None":
    """The display of the compile running in this thread, if any."""
    return _ACTIVE.get()


class PhaseProgress:
    """`with PhaseProgress("qlower compile") as show: show("capturing"); ...`: each call starts a
    phase. Nested displays (a compile inside a compile) defer to the outer one."""

    def __init__(self, title: str = "qlower", delay: float = 2.0, console: Console | None = None):
        self.title, self.delay = title, delay
        self.console = console or Console(stderr=True)
        self.enabled = self.console.is_terminal
        self._text, self._since, self._start = "", 0.0, 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._status = None
        self._thread: threading.Thread | None = None
        self._token = None
        self._outer: PhaseProgress | None = None
        self.shown = False     # whether the line was ever drawn

    def __enter__(self) -> "PhaseProgress":
        self._outer = active()
        self._token = _ACTIVE.set(self._outer or self)
        self._start = time.perf_counter()
        if self.enabled and self._outer is None:
            self._thread = threading.Thread(target=self._watch, name="qlower-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._status is not None:
            self._status.stop()
        _ACTIVE.reset(self._token)

    def __call__(self, text: str) -> None:
        """A new phase begins."""
        if self._outer is not None:
            self._outer(text)
            return
        with self._lock:
            self._text, self._since = text, time.perf_counter()

    def detail(self, text: str) -> None:
        """The same phase, told in more detail ("calibrating, batch 3 of 8"): its clock runs on."""
        if self._outer is not None:
            self._outer.detail(text)
            return
        with self._lock:
            self._text = text

    def _line(self) -> str:
        return f"{self.title}: {self._text} ({time.perf_counter() - self._start:.0f} s)"

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                if not self._text:
                    continue
                if self._status is None:
                    if time.perf_counter() - self._since < self.delay:
                        continue
                    self._status = self.console.status(self._line())
                    self._status.start()
                    self.shown = True
                else:
                    self._status.update(self._line())
