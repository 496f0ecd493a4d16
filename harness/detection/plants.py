"""The planted regressions: each edits a clone of the project into a throwaway commit.

Each plant is code added to the project's own files at an anchor that must be found there: a plant whose
anchor moved fails with one line naming it (``PlantDoesNotApply``), never a silent "caught" or "missed".
The slowdowns are sized to cost the reference trainers about 30 % (the same-thread ones 10/20/30 % of each
call's own CPU time); the count plants add one unit of work per action selection (``act``), which training
makes once per vector step and ``select_actions()`` once per call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

INIT = Path("reference_trainers") / "__init__.py"
INIT_ANCHOR = "build_trainer"
"""The package's factory, which the wrapping plants replace with one that edits the trainer it returns."""


class PlantDoesNotApply(Exception):
    """The code a plant targets is not where it expects (the project moved on): the matrix stops on it."""


@dataclass(frozen=True)
class Plant:
    name: str
    kind: str
    """What the plant does to the code, as the table's row says it."""
    apply: Callable[[Path], None]


def _append_to_init(code: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / INIT
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        if f"def {INIT_ANCHOR}" not in text and f"import {INIT_ANCHOR}" not in text and \
                f" {INIT_ANCHOR}," not in text and f", {INIT_ANCHOR}" not in text:
            raise PlantDoesNotApply(f"{INIT} no longer provides {INIT_ANCHOR}")
        path.write_text(text + code, encoding="utf-8")
    return apply


def _replace(relative: str, old: str, new: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / relative
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        if text.count(old) != 1:
            raise PlantDoesNotApply(f"{relative}: the line it edits ({old.strip()!r}) is not there once")
        path.write_text(text.replace(old, new), encoding="utf-8")
    return apply


_WRAP = '''

# planted regression ({name}): every trainer's {what}
import threading as _threading
import time as _time

import numpy as _np
import torch as _torch

_planted_depth = _threading.local()
_planted_tensor = _torch.ones(4)
_real_build_trainer = build_trainer


def _planted_after(call, extra):
    def planted(*args, **kwargs):
        depth = getattr(_planted_depth, "value", 0)
        _planted_depth.value = depth + 1
        start = _time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            _planted_depth.value = depth
            if depth == 0:
                extra(args, _time.thread_time() - start)
    return planted


def build_trainer(resolution, probe=None):
    trainer = _real_build_trainer(resolution, probe)
{wrap}    return trainer
'''


def _busy_fraction(fraction: float) -> str:
    return f'''
def _extra(args, spent):
    end = _time.thread_time() + {fraction!r} * spent
    while _time.thread_time() < end:
        pass
'''


def _wrapping(name: str, what: str, extra: str, methods: tuple[str, ...]) -> Callable[[Path], None]:
    wrap = "".join(f"    trainer.{m} = _planted_after(trainer.{m}, _extra)\n" for m in methods)
    return _append_to_init(_WRAP.format(name=name, what=what, wrap=wrap) + extra)


_BUSY_THREAD = '''

# planted regression (busy_thread): a background thread started at import, busy 30 % of the time
import threading as _threading
import time as _time


def _planted_busy():
    while True:
        end = _time.perf_counter() + 0.003
        while _time.perf_counter() < end:
            pass
        _time.sleep(0.007)


_threading.Thread(target=_planted_busy, name="planted-busy", daemon=True).start()
'''

_THREAD_COUNT = '''

# planted regression (thread_count): every trainer's activate() leaves torch on every core of the machine
import os as _os

import torch as _torch

_real_build_trainer_threads = build_trainer


def build_trainer(resolution, probe=None):
    trainer = _real_build_trainer_threads(resolution, probe)
    activate = trainer.activate

    def planted_activate(*args, **kwargs):
        out = activate(*args, **kwargs)
        _torch.set_num_threads(max(2, _os.cpu_count() or 2))
        return out

    trainer.activate = planted_activate
    return trainer
'''

_GLOBAL_SETTING = '''

# planted regression (global_setting): a global debugging setting left on at import (every backward is checked)
import torch as _torch

_torch.autograd.set_detect_anomaly(True)
'''

ACTING = ("act",)
"""The trainers' one acting call (``self.act``): the training rollout and ``select_actions()`` both go through it, so
a plant there costs every env step of training and every selection the acting benchmarks time."""

_SYNC = '''
def _extra(args, spent):
    _planted_tensor.sum().item()
'''
_KERNEL = '''
def _extra(args, spent):
    _planted_tensor.mul(2.0)
'''
_FLOAT64 = '''
def _extra(args, spent):
    _torch.as_tensor(_np.asarray(args[0]), dtype=_torch.float64).mul(0.5)
'''

def same_thread(pct: int) -> Plant:
    """After each ``iterate()`` and ``select_actions()`` (not nested), a busy loop of ``pct`` % of the call's own
    thread CPU time: ``pct`` % more work on any machine."""
    if not 0 < pct < 1000:
        raise ValueError(f"{pct} %: give the extra work in percent, e.g. 20")
    return Plant(f"same_thread_{pct}", f"same-thread CPU +{pct} % in iterate() and action selection",
                 _wrapping(f"same_thread_{pct}", f"iterate() and select_actions() do {pct} % more CPU work",
                           _busy_fraction(pct / 100), ("iterate", "select_actions")))


PLANTS: dict[str, Plant] = {p.name: p for p in (
    Plant("aa", "A/A: nothing changed (an empty commit)", lambda root: None),
    *(same_thread(pct) for pct in (10, 20, 30)),
    Plant("busy_thread", "a busy background thread started at import (30 % of a core)", _append_to_init(_BUSY_THREAD)),
    Plant("thread_count", "a thread-count regression (torch on every core after activate())",
          _append_to_init(_THREAD_COUNT)),
    Plant("global_setting", "a global torch setting that slows every backward (anomaly detection on)",
          _append_to_init(_GLOBAL_SETTING)),
    Plant("host_sync", "one more host sync per step (.item() in every action selection)",
          _wrapping("host_sync", "action selection makes one more .item()", _SYNC, ACTING)),
    Plant("kernel", "one more kernel per step (in every action selection)",
          _wrapping("kernel", "action selection launches one more kernel", _KERNEL, ACTING)),
    Plant("float64", "float64 brought into a trainer (the observations as float64 in every action selection)",
          _wrapping("float64", "action selection computes on the observations in float64", _FLOAT64, ACTING)),
    Plant("flag_noop", "a flag turned into a silent no-op (sync_free_logging ignored)",
          _replace("reference_trainers/paths/learner.py", "self.stats = make_stats(o.sync_free_logging, device)",
                   "self.stats = make_stats(False, device)  # planted regression (flag_noop)")),
)}
"""Every kind of regression the matrix plants, the A/A commit first."""
