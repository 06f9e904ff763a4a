"""Third-party noise kept off the user's terminal while qlower works (compile, quantize, save,
load, export): deprecation notices that torch and its ecosystem print from inside their own code
and that the user can do nothing about. Each filter names one message; every other warning and
log record passes through, and the filters are removed when the call returns."""
from __future__ import annotations

import contextlib
import functools
import logging
import re
import warnings

# (category, message regex) of warnings raised inside third-party code during qlower's calls
WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # torch.export deep-copies its module call graph; typing_extensions' deprecated LeafSpec
    # constructor warns on every copy (torch 2.13, run_decompositions of an SDPA program)
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
)
# (logger, message regex) of log records from third-party code during qlower's calls
LOG_RECORDS: tuple[tuple[str, str], ...] = (
    # torchao registers its enums (ScaleCalculationMode, KernelPreference) as pytree constants
    # when a submodule is first imported; torch logs a deprecation for each
    ("torch.utils._pytree", r"is an Enum subclass and is now natively supported"),
)


class _DropRecords(logging.Filter):
    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


@contextlib.contextmanager
def third_party_quiet():
    """Within: the known third-party warnings (`WARNINGS`) are ignored and the known log records
    (`LOG_RECORDS`) dropped; everything else is shown as usual."""
    filters = [(logging.getLogger(name), _DropRecords(pattern)) for name, pattern in LOG_RECORDS]
    for logger, f in filters:
        logger.addFilter(f)
    try:
        with warnings.catch_warnings():
            for category, pattern in WARNINGS:
                warnings.filterwarnings("ignore", message=pattern, category=category)
            yield
    finally:
        for logger, f in filters:
            logger.removeFilter(f)


def quiet(fn):
    """Decorator: `fn` runs under `third_party_quiet()`."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with third_party_quiet():
            return fn(*args, **kwargs)
    return wrapper
