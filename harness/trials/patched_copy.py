"""Copies of the user's files with the source changes made, in a folder of their own that the arm's process
puts first on ``sys.path``; the user's files are only ever read."""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path

from harness.trials.source_edits import EditRefused, apply_edits


def importable_as_copy(path: Path) -> None:
    """Refuse (``EditRefused``) a file that a copy in another folder would not replace: it must be the module
    imported under its own name (``NAME.py`` beside the YAML file or on the import path, not in a package). In a
    process that never imported it (a Ray job's), the module that name would import from ``sys.path`` must be it."""
    target = path.resolve()
    if _file_of(sys.modules.get(path.stem)) == target:
        return
    names = [name for name, module in list(sys.modules.items()) if _file_of(module) == target]
    if names:
        ok = path.stem in names
    else:
        spec = importlib.machinery.PathFinder.find_spec(path.stem, sys.path) if path.stem.isidentifier() else None
        ok = spec is not None and spec.origin is not None and Path(spec.origin).resolve() == target
    if not ok:
        raise EditRefused(f"{path.name} is not imported as the top-level module {path.stem} (files inside a "
                          "package are not copied); edit it by hand")


def _file_of(module: object) -> Path | None:
    where = getattr(module, "__file__", None)
    try:
        return Path(where).resolve() if isinstance(where, str) else None
    except (OSError, ValueError):
        return None


def arrange_search(folders: list[str]) -> None:
    """``folders`` (the parent's import path) on this process's ``sys.path`` where missing, so that a module is found
    here as it was there (a Ray job's process)."""
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(0, folder)


def read_source(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EditRefused(f"cannot read {path}: {exc}") from None


def site(where: str) -> tuple[Path, int]:
    """``file:line`` as (path, line)."""
    path, _, line = where.rpartition(":")
    return Path(path), int(line)


def edited_files(edits: list[tuple[str, str]]) -> dict[Path, tuple[str, str]]:
    """``(change, file:line)`` edits made on the files' texts: path -> (original, edited). ``EditRefused`` when one
    cannot be made."""
    by_file: dict[Path, list[tuple[str, int]]] = {}
    for change, where in edits:
        path, line = site(where)
        by_file.setdefault(path, []).append((change, line))
    out = {}
    for path, pairs in by_file.items():
        importable_as_copy(path)
        original = read_source(path)
        out[path] = (original, apply_edits(original, pairs))
    return out


def write_copies(files: dict[Path, tuple[str, str]], folder: Path) -> Path:
    """The edited texts written into ``folder`` under their own names; returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for path, (_, edited) in files.items():
        (folder / path.name).write_bytes(edited.encode("utf-8"))
    return folder
