"""Where a call came from: the innermost frame in the user's code (``file:line``)."""

from __future__ import annotations

import importlib.util
import linecache
import os
import re
import sys
import sysconfig
from collections import Counter
from types import FrameType

import numpy
import torch

_LIBRARIES = [os.path.dirname(torch.__file__), os.path.dirname(numpy.__file__),
              sysconfig.get_paths()["stdlib"]]
try:
    import gymnasium

    _LIBRARIES.append(os.path.dirname(gymnasium.__file__))
except ImportError:  # pragma: no cover - gymnasium is a dependency
    pass
for _name in ("tensordict",):  # a data-structure library: its ops are the caller's (found without importing it)
    _spec = importlib.util.find_spec(_name)
    if _spec is not None and _spec.submodule_search_locations:
        _LIBRARIES.append(list(_spec.submodule_search_locations)[0])
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
        self.calls: dict[str, Counter[str]] = {}
        """The call expression running at each site ``where`` returned (``torch.as_tensor(reward)``), by site."""

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

    def chain(self, depth: int = 1, limit: int = 8) -> tuple[str, ...]:
        """``file:line`` of each frame in user code above the caller, innermost first (at most ``limit``), past
        the network's own methods (frames whose ``self`` is a ``torch.nn.Module``: ``get_action``) where a frame
        outside them calls in."""
        frame, found, methods = sys._getframe(depth), [], []
        while frame is not None and len(found) < limit:
            code = frame.f_code
            if not self._skip(code.co_filename):
                site = f"{code.co_filename}:{frame.f_lineno}"
                inside = "self" in code.co_varnames and isinstance(frame.f_locals.get("self"), torch.nn.Module)
                (methods if inside and not found else found).append(site)
            frame = frame.f_back
        return tuple(found or methods) or ("?",)

    def frame(self, depth: int = 1) -> FrameType | None:
        """The innermost frame in user code above the caller, or None."""
        frame = sys._getframe(depth)
        while frame is not None and self._skip(frame.f_code.co_filename):
            frame = frame.f_back
        return frame

    def where(self, depth: int = 1) -> str:
        """``file:line`` of the innermost frame in user code above the caller, or ``?`` where none is."""
        frame = sys._getframe(depth)
        while frame is not None:
            if not self._skip(frame.f_code.co_filename):
                site = f"{frame.f_code.co_filename}:{frame.f_lineno}"
                call = call_text(frame)
                if call:
                    self.calls.setdefault(site, Counter())[call] += 1
                return site
            frame = frame.f_back
        return "?"


_STORE_VERBS = frozenset(("add", "extend", "insert", "push", "store", "append", "__setitem__", "set", "write"))
_STORAGE = re.compile(r"Buffer|Replay|Storage|Memory")
RL_LIBRARIES = ("torchrl", "tensordict", "stable_baselines3", "envpool", "gym", "sbx", "rl_games", "tianshou")
"""RL libraries whose own code can be where a sync is made (``library_of``)."""


def context_of(frame: FrameType | None, limit: int = 40) -> str | None:
    """What a call runs inside, from the frames above it: ``distribution:Normal`` (a distribution's own method),
    ``storage:RolloutBuffer.add`` (a buffer's store method: a copy into rollout/replay storage), or None."""
    from torch.distributions import Distribution

    while frame is not None and limit:
        owner = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        if owner is not None:
            if isinstance(owner, Distribution):
                return f"distribution:{type(owner).__name__}"
            name = type(owner).__name__
            if frame.f_code.co_name in _STORE_VERBS and _STORAGE.search(name):
                return f"storage:{name}.{frame.f_code.co_name}"
        frame, limit = frame.f_back, limit - 1
    return None


def library_of(where: str) -> str | None:
    """The RL library a site lies in (``torchrl``, ``stable_baselines3``...), or None."""
    parts = where.rpartition(":")[0].split(os.sep)
    return next((name for name in RL_LIBRARIES if name in parts[:-1]), None)


def raise_site(exc: BaseException, finder: "SiteFinder | None" = None) -> str | None:
    """``file:line`` of the innermost frame in user code of ``exc``'s traceback (where the trainer raised), or
    of the innermost frame where none is the user's (a library's)."""
    finder = finder or SiteFinder()
    tb, last, user = exc.__traceback__, None, None
    while tb is not None:
        last = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        if not finder._skip(tb.tb_frame.f_code.co_filename):
            user = last
        tb = tb.tb_next
    return user or last


def call_text(frame: FrameType) -> str | None:
    """The source of the call a frame is making (``torch.as_tensor(reward)``) where it fits on its line and is
    not the whole line; None otherwise."""
    try:
        line, end, col, end_col = list(frame.f_code.co_positions())[frame.f_lasti // 2]
    except (IndexError, ValueError):
        return None
    if line is None or line != end or col is None or end_col is None:
        return None
    source = linecache.getline(frame.f_code.co_filename, line)
    text = source[col:end_col] if source else ""
    return text if text and text.strip() != source.strip() else None


def short(site: str) -> str:
    """A site relative to the current folder where it lies under it (shorter console lines)."""
    path, _, line = site.rpartition(":")
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return site
    return f"{relative}:{line}" if path and not relative.startswith("..") else site
