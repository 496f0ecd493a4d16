"""One way to write a file: a temporary file in the same folder, synced, then renamed over the target."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def write_atomically(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Call ``write`` on a temporary binary file beside ``path``, then rename it over ``path``: a reader
    sees the old file or the new one, never half of one. An existing file keeps its permission bits;
    a new one gets the usual ``0o666 & ~umask``. The folder is created if missing and synced after."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        mode = path.stat().st_mode & 0o777
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_text_atomically(path: Path, text: str) -> None:
    """``write_atomically`` for UTF-8 text, written as given (no newline translation)."""
    write_atomically(path, lambda handle: handle.write(text.encode("utf-8")))
