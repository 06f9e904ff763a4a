"""qlower's settings: every `QLOWER_*` environment variable, read in this one place into a typed,
validated `Settings`.

`settings()` is what the rest of qlower calls; it is never called at import time. It reads the
variables listed in `VARIABLES` and builds a new `Settings` only when one of them has changed since
the last call (a test's monkeypatch, a user's `os.environ[...] = ...` before a compile), so a
process that never changes its environment parses it once.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import QlowerError

DEFAULT_MEMORY_CACHE_ENTRIES = 64

# name -> what it does (docs/architecture.md, "Settings", lists the same table)
VARIABLES: dict[str, str] = {
    "QLOWER_CACHE_DIR": "compiled-cluster and engine-choice disk cache: a directory, or 'off' "
                        "(default ~/.cache/qlower/onnxruntime)",
    "QLOWER_MEMORY_CACHE_ENTRIES": "compiled clusters kept in memory per process "
                                   f"(positive integer, default {DEFAULT_MEMORY_CACHE_ENTRIES})",
    "QLOWER_AUTO_BACKENDS": "backend='auto' candidates, comma-separated (one name: that engine, unmeasured)",
    "QLOWER_OP_ALLOWLIST": "';'-separated schema names (e.g. 'aten::gelu') every backend must accept",
    "QLOWER_OP_DENYLIST": "';'-separated schema names every backend must refuse (they run in PyTorch)",
    "QLOWER_CHECK_CLUSTERS": "'1': run every engine cluster in PyTorch too and record the worst difference",
    "QLOWER_DUMP_PASSES": "a directory: write the graph after every pass there",
}


@dataclass(frozen=True)
class Settings:
    cache_dir: Path | None = Path.home() / ".cache" / "qlower" / "onnxruntime"   # None: no disk cache
    memory_cache_entries: int = DEFAULT_MEMORY_CACHE_ENTRIES
    auto_backends: tuple[str, ...] | None = None     # None: every candidate
    auto_backends_source: str = "default"            # where auto_backends came from (for messages)
    op_allowlist: frozenset[str] = frozenset()
    op_denylist: frozenset[str] = frozenset()
    check_clusters: bool = False
    dump_passes: Path | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        raw_cache = env.get("QLOWER_CACHE_DIR", "")
        cache_dir = None if raw_cache == "off" else Path(raw_cache) if raw_cache else cls.cache_dir
        auto_raw = env.get("QLOWER_AUTO_BACKENDS", "").strip()
        auto = tuple(dict.fromkeys(n.strip() for n in auto_raw.split(",") if n.strip())) or None
        dump = env.get("QLOWER_DUMP_PASSES", "")
        return cls(cache_dir=cache_dir,
                   memory_cache_entries=_positive_int(env, "QLOWER_MEMORY_CACHE_ENTRIES", DEFAULT_MEMORY_CACHE_ENTRIES),
                   auto_backends=auto,
                   auto_backends_source=f"$QLOWER_AUTO_BACKENDS={auto_raw}" if auto else "default",
                   op_allowlist=_names(env, "QLOWER_OP_ALLOWLIST"),
                   op_denylist=_names(env, "QLOWER_OP_DENYLIST"),
                   check_clusters=env.get("QLOWER_CHECK_CLUSTERS", "") == "1",
                   dump_passes=Path(dump) if dump else None)


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise QlowerError(f"{name}={raw!r} is not a positive integer",
                          hint=f"{VARIABLES[name]}; unset it for the default")
    return value


def _names(env: Mapping[str, str], name: str) -> frozenset[str]:
    return frozenset(s.strip() for s in env.get(name, "").split(";") if s.strip())


_lock = threading.Lock()
_current: tuple[tuple, Settings] | None = None


def settings() -> Settings:
    """The settings of the current environment (parsed again only when a variable changed)."""
    global _current
    key = tuple(os.environ.get(name) for name in VARIABLES)
    with _lock:
        if _current is None or _current[0] != key:
            _current = (key, Settings.from_env())
        return _current[1]
