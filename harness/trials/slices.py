"""Alternating slices: every arm's process kept alive, the arms taking turns in slices a fraction of a second
long, each changed slice between two slices of the unchanged trainer (U A1 U A2 U ... U).

A process's speed on a shared or virtual machine drifts over seconds, as much within one process as between
processes (docs/tracking.md). Fresh processes run one after another compare moments seconds apart; slices
compare moments a quarter of a second apart, and each changed slice is divided by the mean of the unchanged
slices just before and after it, which cancels a drift that is linear over the three. Process-wide settings
still get their own process: one per arm, started afresh every round (``rounds``), so a process's own luck
(where the allocator put things) is not taken for the change's effect.

The ratio of a pair is the changed slice's env steps/s (wall time) over the unchanged slices'; a round's value is
the geometric mean of its pairs' ratios, and the effect is the median of the rounds' values with a 95 % Student-t
interval over rounds (``rounds``: the round is the unit). CPU time is kept beside it, reported, never the verdict.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from harness.trials.arms import Arm, ArmRunner
from harness.trials.rounds import INTERIM_CONFIDENCE, UNCHANGED, Effect, UnchangedFailed

SLICE_SECONDS = 0.25
"""Wall seconds a slice aims at (whole calls of the trainer, at least one)."""
CYCLES = 4
"""Turns of every arm per round: a round gives each arm this many pairs (averaged into the round's one value)."""


def slice_steps(probe: dict[str, Any]) -> int:
    """Env steps of a slice: ``SLICE_SECONDS`` of the unchanged trainer's work at the rate of one call of it, timed
    once every process is ready (a rate taken while the arms warm up side by side is the machine's, not its)."""
    rate = float(probe["env_steps"]) / max(float(probe["wall"]), 1e-9)
    return max(1, math.ceil(rate * SLICE_SECONDS))


def measure(runner: ArmRunner, arms: list[Arm], rounds: int, effects: dict[str, Effect],
            say: Callable[[str], None], cycles: int = CYCLES, label: str = "round",
            exempt: frozenset[str] = frozenset()) -> int:
    """Up to ``rounds`` rounds of ``cycles`` turns into ``effects`` (by arm name; an arm that fails keeps its cause
    and leaves); the rounds run. It stops early, after at least ``MIN_ROUNDS``, once every live arm but those
    ``exempt`` (the A/A arm: a check, not a decision) is decisive (``Effect.decisive``). A KeyboardInterrupt leaves
    the pairs measured so far in ``effects``."""
    for name in (arm.name for arm in arms):
        effects.setdefault(name, Effect())
    steps = 0
    for number in range(rounds):
        live = [arm for arm in arms if effects[arm.name].error is None]
        if not live:
            return number
        served = {arm.name: runner.serve(arm) for arm in [Arm(UNCHANGED), *live]}
        try:
            base = served[UNCHANGED].ready()
            if "error" in base:
                raise UnchangedFailed(f"the unchanged trainer failed in round {number + 1}: {base['error']}")
            for arm in live:
                answer = served[arm.name].ready()
                if "error" in answer:
                    _fail(effects[arm.name], answer, served[arm.name])
                else:
                    effects[arm.name].add_checks(base, answer)
            steps = steps or slice_steps(_unchanged_slice(served[UNCHANGED], 1))
            _turns(served, [a for a in live if effects[a.name].error is None], effects, steps, cycles, number)
        finally:
            for process in served.values():
                process.close()
        shown = [f"{arm.name} {effects[arm.name].ratio().value:.3f}x" for arm in live
                 if effects[arm.name].error is None and effects[arm.name].pairs]
        say(f"try: {label} {number + 1}/{rounds} ({cycles} turns of {steps:,} env steps a slice): "
            + (", ".join(shown) or "every change failed"))
        deciding = [effects[a.name] for a in arms if a.name not in exempt and effects[a.name].error is None]
        if number + 1 < rounds and deciding and all(e.decisive() for e in deciding):
            say(f"try: stopped after {number + 1} of {rounds} {label}s: every interval is already decisive at "
                f"{INTERIM_CONFIDENCE:.0%}")
            return number + 1
    return rounds


def _turns(served: dict[str, Any], live: list[Arm], effects: dict[str, Effect], steps: int, cycles: int,
           round_index: int) -> None:
    unchanged = served[UNCHANGED]
    before = _unchanged_slice(unchanged, steps)
    for cycle in range(cycles):
        order = live if cycle % 2 == 0 else list(reversed(live))
        for arm in order:
            if effects[arm.name].error is not None:
                continue
            changed = served[arm.name].slice(steps)
            after = _unchanged_slice(unchanged, steps)
            if "error" in changed:
                _fail(effects[arm.name], changed, served[arm.name])
            else:
                effects[arm.name].add_pair(before, changed, after, round_index)
            before = after


def _fail(effect: Effect, answer: dict[str, Any], process: Any) -> None:
    effect.error = answer["error"]
    effect.log = str(getattr(process, "log", "")) or None


def _unchanged_slice(process: Any, steps: int) -> dict[str, Any]:
    answer = process.slice(steps)
    if "error" in answer:
        raise UnchangedFailed(f"the unchanged trainer failed: {answer['error']}")
    return answer
