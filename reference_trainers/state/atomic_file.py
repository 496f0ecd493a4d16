"""The one way rlgauge writes a file: checked, then a temporary file beside it, synced, renamed over it.

What may be written (``check_target``, also run before a command measures anything):

- a new file, or an existing regular file that is writable; anything else that exists under the
  name (a directory, a FIFO, a device, a socket) is refused, never replaced;
- a read-only file (no write bit, or not writable for this user) is refused, as root too;
- a symlink is followed: its final target is the file written, and the link stays a link;
- the folder must be writable (a missing one is created, where the caller allows it).

An existing file keeps its permission bits (and, where allowed, its owner); a new file gets
``0o666 & ~umask`` as with any other tool: the temporary file is created with mode ``0o666`` and
the kernel applies the umask (``tempfile.mkstemp`` would make it ``0o600``).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO

from reference_trainers.config.errors import ConfigError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class UnsafeTargetError(OSError, ConfigError):
    """An output path that must not be written (not a regular file, read-only, an unwritable folder).

    A ``ConfigError`` because the path is the user's input (every CLI turns it into exit code 2 and
    one line); an ``OSError`` so that callers catching write failures catch it too. ``str(err)`` is
    one line that starts with the path."""


def kind_of(mode: int) -> str:
    """``"a directory"``, ``"a FIFO (named pipe)"``, ...: what a non-regular ``st_mode`` is."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def is_writable(path: Path, st: os.stat_result) -> bool:
    """Writable for this process and not read-only by its mode bits: root passes ``os.access`` for
    any file, so a file (or folder) without any write bit counts as read-only for everyone."""
    return bool(st.st_mode & 0o222) and os.access(path, os.W_OK)


def real_target(path: Path) -> Path:
    """The file a write to ``path`` lands in: ``path`` itself, or a symlink's final target.

    ``UnsafeTargetError`` for a symlink that loops or whose target's folder does not exist."""
    path = Path(path)
    if not path.is_symlink():
        return path
    real = Path(os.path.realpath(path))
    try:
        os.stat(path)
    except FileNotFoundError:  # a dangling link: the file it names is created, in an existing folder
        if not real.parent.is_dir():
            raise UnsafeTargetError(f"{path}: a symlink to {real}, whose folder does not exist") from None
    except OSError as exc:
        raise UnsafeTargetError(f"{path}: a symlink that cannot be followed ({exc.strerror or exc})") from None
    return real


def check_folder(folder: Path, for_path: Path) -> None:
    """``folder`` (or, while it does not exist yet, its first existing ancestor, where it would be
    created) is a writable directory. ``UnsafeTargetError`` naming ``for_path`` otherwise."""
    existing = Path(folder)
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        st = os.stat(existing)
    except OSError as exc:
        raise UnsafeTargetError(f"{for_path}: {existing} cannot be used as a folder ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(st.st_mode):
        what = "a file" if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)
        raise UnsafeTargetError(f"{for_path}: {existing} is {what}, not a directory")
    if not (is_writable(existing, st) and os.access(existing, os.X_OK)):
        raise UnsafeTargetError(f"{for_path}: cannot create files in {existing} (the folder is not writable, "
                                f"mode {stat.S_IMODE(st.st_mode):04o})")


def check_target(path: Path) -> Path:
    """Check that ``path`` may be written (the rules in the module docstring) and return the real
    file that will be written (a symlink's target). Writes nothing."""
    path = Path(path)
    real = real_target(path)
    try:
        st: os.stat_result | None = os.stat(real)
    except (FileNotFoundError, NotADirectoryError):  # new, or below a non-folder (check_folder says which)
        st = None
    except OSError as exc:
        raise UnsafeTargetError(f"{path}: cannot be checked ({exc.strerror or exc})") from None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeTargetError(f"{path}: is {kind_of(st.st_mode)}, not a regular file; rlgauge writes "
                                    "only regular files and never replaces anything else")
        if not is_writable(real, st):
            raise UnsafeTargetError(f"{path}: is read-only (mode {stat.S_IMODE(st.st_mode):04o}); make it "
                                    "writable or give another path")
    check_folder(real.parent, path)
    return real


def _temporary(folder: Path, name: str) -> tuple[int, Path]:
    """A new file ``.NAME.XXXX.tmp`` in ``folder``, created with mode 0o666 so the umask applies."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = folder / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(folder))


def write_atomically(path: Path, write: Callable[[IO[bytes]], None], *, make_folder: bool = True) -> None:
    """Call ``write`` on a temporary binary file beside the real target of ``path``, then rename it
    over that target: a reader sees the old file or the new one, never half of one.

    ``check_target``'s rules apply (``UnsafeTargetError`` before anything is written). A missing
    folder is created when ``make_folder``; the folder is synced after the rename."""
    path = Path(path)
    real = check_target(path)
    if make_folder:
        real.parent.mkdir(parents=True, exist_ok=True)
    try:
        old: os.stat_result | None = os.stat(real)
    except FileNotFoundError:
        old = None
    fd, tmp = _temporary(real.parent, real.name)
    try:
        with os.fdopen(fd, "wb") as handle:
            if old is not None:  # an existing file keeps its owner (where allowed) and its mode
                if (old.st_uid, old.st_gid) != (os.getuid(), os.getgid()):
                    try:
                        os.fchown(handle.fileno(), old.st_uid, old.st_gid)
                    except PermissionError:
                        pass
                os.fchmod(handle.fileno(), stat.S_IMODE(old.st_mode))
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, real)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(real.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_text_atomically(path: Path, text: str, *, make_folder: bool = True) -> None:
    """``write_atomically`` for UTF-8 text, written as given (no newline translation)."""
    write_atomically(path, lambda handle: handle.write(text.encode("utf-8")), make_folder=make_folder)
