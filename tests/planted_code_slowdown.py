"""Plant a same-thread code slowdown in a copy of the project: every trainer's ``iterate()`` and
``select_actions()`` do ``FRACTION`` more CPU work (a busy loop in the calling thread, sized from the
call's own CPU time, so 0.2 costs 20 % more on any machine; a nested call is not slowed twice).

    python tests/planted_code_slowdown.py COPY_ROOT 0.2

It appends to ``COPY_ROOT/reference_trainers/__init__.py`` (never run it on your checkout); the asv
checks in ``tests/test_asv_suite.py`` and the measured campaigns in docs/tracking.md commit the result
and compare it with its parent.
"""

from __future__ import annotations

import sys
from pathlib import Path

PLANTED = '''

# planted by tests/planted_code_slowdown.py: iterate() and select_actions() do {fraction:.0%} more CPU work
import threading as _threading
import time as _time

_PLANTED_FRACTION = {fraction!r}
_planted_depth = _threading.local()
_real_build_trainer = build_trainer


def _slowed(call):
    def slowed(*args, **kwargs):
        depth = getattr(_planted_depth, "value", 0)
        _planted_depth.value = depth + 1
        start = _time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            _planted_depth.value = depth
            if depth == 0:
                end = _time.thread_time() + _PLANTED_FRACTION * (_time.thread_time() - start)
                while _time.thread_time() < end:
                    pass
    return slowed


def build_trainer(resolution, probe=None):
    trainer = _real_build_trainer(resolution, probe)
    trainer.iterate = _slowed(trainer.iterate)
    trainer.select_actions = _slowed(trainer.select_actions)
    return trainer
'''


def plant(root: Path, fraction: float) -> None:
    """Append the planted slowdown of ``fraction`` to the copy at ``root``."""
    if not 0 < fraction < 10:
        raise ValueError(f"fraction {fraction}: give the extra work as a fraction, e.g. 0.2 for 20 %")
    init = root / "reference_trainers" / "__init__.py"
    init.write_text(init.read_text(encoding="utf-8") + PLANTED.format(fraction=fraction), encoding="utf-8")


if __name__ == "__main__":
    plant(Path(sys.argv[1]), float(sys.argv[2]))
