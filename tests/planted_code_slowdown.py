"""Plant a same-thread code slowdown in a copy of the project: every trainer's ``iterate()`` and
``select_actions()`` do ``FRACTION`` more CPU work (a busy loop in the calling thread, sized from the
call's own CPU time, so 0.2 costs 20 % more on any machine; a nested call is not slowed twice). The plant is
the detection matrix's own (``harness.detection.plants.same_thread``).

    python tests/planted_code_slowdown.py COPY_ROOT 0.2

It appends to ``COPY_ROOT/reference_trainers/__init__.py`` (never run it on your checkout); the asv
checks in ``tests/test_asv_suite.py`` commit the result and compare it with its parent.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.detection.plants import same_thread  # noqa: E402


def plant(root: Path, fraction: float) -> None:
    """Append the planted slowdown of ``fraction`` to the copy at ``root``."""
    if not 0 < fraction < 10:
        raise ValueError(f"fraction {fraction}: give the extra work as a fraction, e.g. 0.2 for 20 %")
    same_thread(round(fraction * 100)).apply(root)


if __name__ == "__main__":
    plant(Path(sys.argv[1]), float(sys.argv[2]))
