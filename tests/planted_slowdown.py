"""Run the ``rlgauge`` CLI with a slowdown planted in chosen variants (test-only: product code untouched).

    python tests/planted_slowdown.py --factor 1.25 --variant optimized -- gate --run ppo-cartpole ...

After its warm-up, each trainer of a chosen variant sleeps after every ``iterate()`` for
``factor - 1`` times that iteration's own duration, so its env steps/sec drop to ``1 / factor``
of what they would be (1.25: a 20 % slowdown), whatever the machine's speed.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from harness import runner
from harness.cli import main


def slow_down(trainer: Any, factor: float) -> None:
    """Make ``trainer.iterate`` take ``factor`` times as long (a sleep proportional to its own duration)."""
    real = trainer.iterate

    def iterate() -> Any:
        start = time.perf_counter()
        done = real()
        time.sleep((factor - 1.0) * (time.perf_counter() - start))
        return done

    trainer.iterate = iterate


def plant(factor: float, variants: set[str]) -> None:
    real_warm_up = runner._warm_up

    def warm_up(live: Any, progress: Any, *rest: Any) -> None:
        real_warm_up(live, progress, *rest)
        if live.trainer is not None and live.spec.variant in variants:
            slow_down(live.trainer, factor)

    runner._warm_up = warm_up


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factor", type=float, required=True, help="1.25 = a 20 %% slowdown")
    parser.add_argument("--variant", action="append", required=True, help="variant to slow down (repeatable)")
    parser.add_argument("rlgauge_args", nargs=argparse.REMAINDER, help="-- then the rlgauge arguments")
    args = parser.parse_args(argv)
    if args.factor < 1.0:
        parser.error("--factor must be >= 1")
    rest = args.rlgauge_args[1:] if args.rlgauge_args[:1] == ["--"] else args.rlgauge_args
    plant(args.factor, set(args.variant))
    return main(rest)


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
