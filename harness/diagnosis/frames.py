"""Where a call came from: the innermost frame in the user's code (``file:line``)."""

from __future__ import annotations

import os
import sys
import sysconfig

import numpy
import torch

_LIBRARIES = [os.path.dirname(torch.__file__), os.path.dirname(numpy.__file__),
              sysconfig.get_paths()["stdlib"]]
try:
    import gymnasium

    _LIBRARIES.append(os.path.dirname(gymnasium.__file__))
except ImportError:  # pragma: no cover - gymnasium is a dependency
    pass
_HARNESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REFERENCE = os.path.join(os.path.dirname(_HARNESS), "reference_trainers")
LIBRARY_DIRS: tuple[str, ...] = tuple(_LIBRARIES)
_TORCH = os.path.dirname(torch.__file__)
_VIA_DIRS = (os.path.join(_TORCH, "optim") + os.sep, os.path.join(_TORCH, "distributions") + os.sep)
_VIA = ("torch.optim", "torch.distributions")
RLGAUGE_DIRS: tuple[str, ...] = (_HARNESS, _REFERENCE)


class SiteFinder:
    """Finds the innermost frame outside torch, numpy, gymnasium, the standard library and rlgauge.

    ``own_code_is_rlgauge``: the trainer diagnosed is one of rlgauge's own (a preset), so
    ``reference_trainers`` is the user's code and only ``harness`` is skipped.
    """

    def __init__(self, own_code_is_rlgauge: bool = False) -> None:
        skipped = LIBRARY_DIRS + ((_HARNESS,) if own_code_is_rlgauge else RLGAUGE_DIRS)
        self._skipped = tuple(d + os.sep for d in skipped)
        self._cache: dict[str, bool] = {}

    def _skip(self, filename: str) -> bool:
        hit = self._cache.get(filename)
        if hit is None:
            hit = self._cache[filename] = filename.startswith(self._skipped) or filename.startswith("<")
        return hit

    def where_via(self, depth: int = 1) -> tuple[str, str | None]:
        """``where`` and the library the call came through on its way from there: ``torch.optim`` (an
        optimizer's own step), ``torch.distributions`` (a distribution's argument checks) or None."""
        frame, via = sys._getframe(depth), None
        while frame is not None:
            filename = frame.f_code.co_filename
            if not self._skip(filename):
                return f"{filename}:{frame.f_lineno}", via
            if via is None and filename.startswith(_VIA_DIRS):
                via = _VIA[filename.startswith(_VIA_DIRS[1])]
            frame = frame.f_back
        return "?", via

    def where(self, depth: int = 1) -> str:
        """``file:line`` of the innermost frame in user code above the caller, or ``?`` where none is."""
        frame = sys._getframe(depth)
        while frame is not None:
            if not self._skip(frame.f_code.co_filename):
                return f"{frame.f_code.co_filename}:{frame.f_lineno}"
            frame = frame.f_back
        return "?"


def short(site: str) -> str:
    """A site relative to the current folder where it lies under it (shorter console lines)."""
    path, _, line = site.rpartition(":")
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return site
    return f"{relative}:{line}" if path and not relative.startswith("..") else site
