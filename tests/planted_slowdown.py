"""Run the ``rlgauge`` CLI with the product's slowdown knob set for chosen variants only.

    python tests/planted_slowdown.py --pct 20 --variant optimized -- gate --run ppo-cartpole ...
    python tests/planted_slowdown.py --factor 1.25 --variant optimized -- ...   # the same: rate x 1/1.25

``--set run.planted_slowdown_pct=PCT`` slows every variant of a command; this wrapper sets the same
key (each timed iteration busy-waits so that env steps/s fall by PCT %) in the named variants' configs
only, e.g. in the optimized variant of ``gate --run``. One variant per command needs no wrapper:
``rlgauge run PRESET --variant optimized --set run.planted_slowdown_pct=20``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from harness.cli import main
from harness.specs.presets import Preset
from reference_trainers.config.files import deep_merge


def pct_of_factor(factor: float) -> float:
    """Iterations ``factor`` times as long -> env steps/s down by this percent (1.25 -> 20)."""
    return 100.0 * (1.0 - 1.0 / factor)


def plant(pct: float, variants: set[str]) -> None:
    """Give the named variants of every preset ``run.planted_slowdown_pct = pct``."""
    real = Preset.variant_data

    def variant_data(self: Preset, variant: str) -> dict[str, Any]:
        data = real(self, variant)
        return deep_merge(data, {"run": {"planted_slowdown_pct": pct}}) if variant in variants else data

    Preset.variant_data = variant_data  # type: ignore[method-assign]


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--pct", type=float, help="env steps/s fall by this percent (0 <= PCT < 100)")
    size.add_argument("--factor", type=float, help="iterations take this many times as long (1.25 = a 20 %% slowdown)")
    parser.add_argument("--variant", action="append", required=True, help="variant to slow down (repeatable)")
    parser.add_argument("rlgauge_args", nargs=argparse.REMAINDER, help="-- then the rlgauge arguments")
    args = parser.parse_args(argv)
    if args.factor is not None and args.factor < 1.0:
        parser.error("--factor must be >= 1")
    pct = args.pct if args.pct is not None else pct_of_factor(args.factor)
    if not 0 <= pct < 100:
        parser.error("--pct must be >= 0 and < 100")
    rest = args.rlgauge_args[1:] if args.rlgauge_args[:1] == ["--"] else args.rlgauge_args
    plant(pct, set(args.variant))
    return main(rest)


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
