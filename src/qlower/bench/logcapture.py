"""bench.log: what third-party code prints or warns while the bench runs goes to a file, so the
terminal keeps the progress and the table."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from pathlib import Path

class _Sink(io.TextIOBase):
    """sys.stdout/sys.stderr while a stack is prepared or timed: into the log file; after the
    bench (a library may keep a handle on the stream it saw) writes are dropped."""

    def __init__(self, log: "LogCapture"):
        self.log = log

    def write(self, text: str) -> int:
        f = self.log.file
        if f is not None and not f.closed:
            f.write(text)
        return len(text)

    def flush(self) -> None:
        f = self.log.file
        if f is not None and not f.closed:
            f.flush()

    def fileno(self) -> int:
        if self.log.file is None or self.log.file.closed:
            raise io.UnsupportedOperation("bench.log is closed")
        return self.log.file.fileno()

    def isatty(self) -> bool:
        return False


class LogCapture:
    """`with capture:` sends what third-party code prints or warns to bench.log: Python's
    sys.stdout/sys.stderr, warnings and log records, and (file descriptors 1 and 2) what native
    code such as ONNX Runtime, OpenVINO or a compiler subprocess writes. The harness enters it
    around each stack's preparation and timing, so the terminal keeps progress and the table.
    LogCapture(None) captures nothing."""

    def __init__(self, path: Path | None):
        self.path, self.file = path, None
        self._sink = _Sink(self)
        self._handler: logging.Handler | None = None

    def open(self) -> "LogCapture":
        if self.path is not None and self.file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(self.path, "a", buffering=1, encoding="utf-8", errors="replace")
            self._handler = logging.StreamHandler(self._sink)
            self._handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        return self

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    def note(self, text: str) -> None:
        if self.file is not None and not self.file.closed:
            self.file.write(text.rstrip("\n") + "\n")

    @contextlib.contextmanager
    def __call__(self):
        if self.file is None:
            yield
            return
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):
                stream.flush()
        saved = []
        try:
            for fd in (1, 2):
                saved.append((fd, os.dup(fd)))
                os.dup2(self.file.fileno(), fd)
        except OSError:   # no such descriptors (embedded interpreters): Python-level capture only
            pass
        root = logging.getLogger()
        root.addHandler(self._handler)
        logging.captureWarnings(True)
        try:
            with contextlib.redirect_stdout(self._sink), contextlib.redirect_stderr(self._sink):
                yield
        finally:
            logging.captureWarnings(False)
            root.removeHandler(self._handler)
            for stream in (sys.__stdout__, sys.__stderr__):
                with contextlib.suppress(Exception):
                    stream.flush()
            self.file.flush()
            for fd, copy in saved:
                os.dup2(copy, fd)
                os.close(copy)
