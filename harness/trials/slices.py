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

from harness.trials.processes.arms import Arm, ArmRunner
from harness.trials.rounds import INTERIM_CONFIDENCE, MIN_ROUNDS, UNCHANGED, Effect, UnchangedFailed

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
            exempt: frozenset[str] = frozenset(), maths: dict[str, dict[str, Any]] | None = None,
            parity_iterations: int = 0, ran: list[dict[str, Any]] | None = None) -> int:
    """Up to ``rounds`` rounds of ``cycles`` turns into ``effects`` (by arm name; an arm that fails keeps its cause
    and leaves); the rounds run. After at least ``MIN_ROUNDS``, an arm already decisive (``Effect.decisive``) is
    measured no further, and the measurement stops once every arm but those ``exempt`` (the A/A arm: a check, not
    a decision, measured in the first ``MIN_ROUNDS`` only: enough for its interval) is. The checks (float64 ops, host syncs: the same in every process) run in the first round only;
    with ``maths``, the first round's processes also check the maths over ``parity_iterations`` calls from the seed
    before they warm up, and their ready answers (``parity``, ``params``) go into it by arm name, the unchanged
    trainer's too. Every slice's answer as it ran (``{"env_steps", "wall", "cpu"}``) goes into ``ran``. A
    KeyboardInterrupt leaves the pairs measured so far in ``effects``."""
    ran = [] if ran is None else ran
    for name in (arm.name for arm in arms):
        effects.setdefault(name, Effect())
    steps = 0
    settled: set[str] = set()
    ready_s: dict[str, float] = {}
    for number in range(rounds):
        live = [arm for arm in arms if effects[arm.name].error is None and arm.name not in settled]
        if not live:
            return number
        served: dict[str, Any] = {}
        try:
            checking = parity_iterations if maths is not None and number == 0 else 0
            answers = _start(runner, _slowest_first([Arm(UNCHANGED), *live], ready_s), served, number == 0, checking)
            if checking:
                maths.update(answers)  # type: ignore[union-attr]
            ready_s.update({name: float(a.get("ready_s") or 0.0) for name, a in answers.items()})
            base = answers[UNCHANGED]
            if "error" in base:
                raise UnchangedFailed(f"the unchanged trainer failed in round {number + 1}: {base['error']}")
            for arm in live:
                answer = answers[arm.name]
                if "error" in answer:
                    _fail(effects[arm.name], answer, served[arm.name])
                elif number == 0:
                    effects[arm.name].add_checks(base, answer)
            steps = steps or slice_steps(_unchanged_slice(served[UNCHANGED], 1))
            first = len(ran)
            _turns(served, [a for a in live if effects[a.name].error is None], effects, steps, cycles, number, ran)
        finally:
            close_all(served.values())
        shown = [f"{arm.name} {effects[arm.name].ratio().value:.3f}x" for arm in live
                 if effects[arm.name].error is None and effects[arm.name].pairs]
        say(f"try: {label} {number + 1}/{rounds} ({cycles} turns; {as_ran(ran[first:])}): "
            + (", ".join(shown) or "every change failed"))
        deciding = [a.name for a in arms if a.name not in exempt and effects[a.name].error is None]
        newly = [name for name in deciding if name not in settled and effects[name].decisive()]
        settled.update(newly)
        if number + 1 >= MIN_ROUNDS:
            settled.update(exempt)
        if number + 1 < rounds and deciding and all(name in settled for name in deciding):
            say(f"try: stopped after {number + 1} of {rounds} {label}s: every interval is already decisive at "
                f"{INTERIM_CONFIDENCE:.0%}")
            return number + 1
        if number + 1 < rounds and newly:
            say(f"try: {', '.join(newly)} already decisive at {INTERIM_CONFIDENCE:.0%}: measured no further")
    return rounds


def _start(runner: ArmRunner, arms: list[Arm], served: dict[str, Any], checks: bool,
           parity_iterations: int = 0) -> dict[str, dict[str, Any]]:
    """Every arm's process started (into ``served``) and its ready answer, at most ``runner.width()`` warming up at
    once: warm-ups whose threads outnumber the cores spin against each other and take several times as long. A
    free place goes to the next arm as soon as any warm-up is done."""
    width = runner.width() if hasattr(runner, "width") else 1
    answers: dict[str, dict[str, Any]] = {}
    waiting: list[str] = []
    for arm in arms:
        while len(waiting) >= width:
            _first_ready(served, waiting, answers)
        served[arm.name] = runner.serve(arm, checks=checks, **({"parity_iterations": parity_iterations}
                                                               if parity_iterations else {}))
        waiting.append(arm.name)
    while waiting:
        _first_ready(served, waiting, answers)
    return answers


def _first_ready(served: dict[str, Any], waiting: list[str], answers: dict[str, dict[str, Any]]) -> None:
    """Wait for whichever of ``waiting`` is ready first; its answer into ``answers``."""
    while True:
        for name in waiting:
            poll = getattr(served[name], "ready_within", None)
            answer = served[name].ready() if poll is None else poll(0.02)
            if answer is not None:
                waiting.remove(name)
                answers[name] = answer
                return


def _slowest_first(arms: list[Arm], ready_s: dict[str, float]) -> list[Arm]:
    """The arms whose processes took longest to be ready last round start first (a compiling arm on one core while
    the others warm up on the rest); the first round keeps the given order."""
    return sorted(arms, key=lambda arm: -ready_s.get(arm.name, 0.0))


def close_all(processes: Any) -> None:
    """Every served process asked to end at once, then each waited for (one by one, their ends would add up)."""
    processes = list(processes)
    for process in processes:
        ending = getattr(process, "end_requests", None)
        if ending is not None:
            ending()
    for process in processes:
        process.close()


def as_ran(answers: list[dict[str, Any]]) -> str:
    """The slices as they ran: their median env steps and wall seconds (a slice is whole calls of the trainer, so
    it may be longer than asked)."""
    import statistics

    if not answers:
        return "no slice ran"
    steps = statistics.median(int(a["env_steps"]) for a in answers)
    wall = statistics.median(float(a["wall"]) for a in answers)
    return f"a slice ran {steps:,.0f} env steps in {wall:.2g} s (median of {len(answers)})"


def _turns(served: dict[str, Any], live: list[Arm], effects: dict[str, Effect], steps: int, cycles: int,
           round_index: int, ran: list[dict[str, Any]]) -> None:
    unchanged = served[UNCHANGED]
    before = _unchanged_slice(unchanged, steps)
    ran.append(before)
    for cycle in range(cycles):
        order = live if cycle % 2 == 0 else list(reversed(live))
        for arm in order:
            if effects[arm.name].error is not None:
                continue
            changed = served[arm.name].slice(steps)
            after = _unchanged_slice(unchanged, steps)
            ran += [answer for answer in (changed, after) if "error" not in answer]
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
