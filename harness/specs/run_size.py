"""How big a ``sweep`` or ``matrix`` is before it runs, and the limit above which it needs ``--yes``.

A grid of two ``--param`` lists grows as their product (201 x 50 values: 10,050 runs), and
``--steps`` / ``--repeats`` multiply every run: such a command is refused (exit 2, one line
with the number of runs and a time estimate) unless the user confirms it with ``--yes``.
Below the limit nothing is printed and nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from harness.errors import UserError

MAX_RUNS = 50
"""Runs (points, or preset variants) a command takes without ``--yes``."""
MAX_ENV_STEPS = 20_000_000
"""Env steps (warm-up included, all runs together) a command takes without ``--yes``."""
ESTIMATE_RATE = 1_000
"""Env steps/s of the time estimate: conservative for the CartPole and Acrobot presets on a CPU
(2,000 to 50,000 in docs/analysis.md), optimistic for the Pong ones (100 to 3,500)."""


@dataclass(frozen=True)
class Size:
    runs: int
    env_steps: int
    """Warm-up plus timed env steps of every run together."""
    exact: bool = True
    """False when the env steps were extrapolated from the first run."""

    @property
    def over_limit(self) -> bool:
        return self.runs > MAX_RUNS or self.env_steps > MAX_ENV_STEPS

    def text(self) -> str:
        about = "" if self.exact else "about "
        per_run = self.env_steps // max(1, self.runs)
        return (f"{self.runs:,} run{'s' * (self.runs != 1)} of {about}{per_run:,} env steps each "
                f"({self.env_steps:,} in all, warm-up included): about {duration(self.env_steps / ESTIMATE_RATE)} "
                f"at {ESTIMATE_RATE:,} env steps/s")

    def limit_text(self) -> str:
        if self.runs > MAX_RUNS:
            return f"more than the {MAX_RUNS} runs"
        return f"more than the {MAX_ENV_STEPS:,} env steps"


def run_env_steps(config: Any) -> int:
    """Warm-up plus ``repeats`` x ``steps`` of one run (a ``TrainConfig``)."""
    run = config.run
    return int(run.warmup_steps) + int(run.repeats) * int(run.steps)


def size_of(configs: Iterable[Any]) -> Size:
    configs = list(configs)
    return Size(len(configs), sum(run_env_steps(c) for c in configs))


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def check_size(command: str, size: Size, yes: bool, say: Callable[[str], None], smaller: str) -> None:
    """Refuse (``UserError``) a command above the limit unless ``yes``; with ``yes``, say its size.
    ``smaller``: how to make it smaller (e.g. "fewer --param values, --steps or --repeats")."""
    if not size.over_limit:
        return
    if not yes:
        raise UserError(f"{command}: {size.text()}; that is {size.limit_text()} it takes without --yes: "
                        f"pass --yes to run it, or measure less ({smaller})")
    say(f"{command}: {size.text()} (--yes given)")
