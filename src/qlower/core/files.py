"""Small file utilities shared by every writer (artifacts, exports, the compile cache)."""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

from ..errors import ArtifactError


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` into a temporary file in `path`'s directory (inside a private folder, so the
    file keeps `path`'s name, which torch's writer uses as the archive root), fsync, then
    os.replace: readers see the old file or the new one, never a partial one. The folder's own
    name is short, so any file name the file system accepts can be written."""
    path = Path(path)
    folder = path.with_name(f".qlower-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        folder.mkdir()
    except OSError as exc:
        raise ArtifactError(f"cannot write {path}: {exc.strerror or exc}",
                            hint="check that the directory exists and is writable") from exc
    tmp = folder / path.name
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise ArtifactError(f"cannot write {path}: {exc.strerror or exc}",
                            hint="check free space and permissions; the previous file is unchanged") from exc
    finally:
        tmp.unlink(missing_ok=True)
        folder.rmdir()
