"""The one way the library writes a file: to a fresh temporary file in the target's folder, fsynced, then
renamed over the target, never through a symlink (docs/runtime.md, "Atomic writes")."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path):
    """Context manager yielding a temporary file (same folder and suffix) to write ``path`` through; on success
    fsynced and renamed over ``path`` (a symlink there is replaced, not followed), on an exception removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:100]}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through `atomic_path` (never through a symlink); returns ``path``."""
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
    return Path(path)


def atomic_write_text(path, text: str) -> Path:
    """Write the UTF-8 ``text`` to ``path`` through `atomic_path`; returns ``path``."""
    return atomic_write_bytes(path, text.encode("utf-8"))


__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text"]
