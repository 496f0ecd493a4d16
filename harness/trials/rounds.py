"""Interleaved rounds: each round runs the unchanged trainer and every changed arm once, each in a fresh
process, the order reversed every other round (unchanged first, then unchanged last) so a drift of the
machine's load falls on both sides alike. A round's ratio is the changed arm's env steps/s (the median of its
repeats) over the unchanged arm's of the same round; the effect is the median over rounds with a 95 %
Student-t interval on the mean log ratio (``harness.stats.intervals.paired_t_ratio``: a round is one costly
unit, and a bootstrap of 3-4 of them is only their range). A verdict needs ``power.MIN_REPEATS`` rounds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from harness.stats import power
from harness.stats.intervals import Ratio, paired_t_ratio
from harness.trials.arms import Arm, ArmRunner

UNCHANGED = "unchanged"
DEFAULT_ROUNDS = 4
REPEATS = 2
"""Timed repeats per arm unless ``--repeats`` says otherwise: the rounds, not the repeats, carry the interval."""


class UnchangedFailed(Exception):
    """The unchanged trainer failed: nothing can be compared with it."""


@dataclass
class Effect:
    """One arm's rounds beside the unchanged trainer's."""

    unchanged: list[float] = field(default_factory=list)
    changed: list[float] = field(default_factory=list)
    unchanged_cpu: list[float] = field(default_factory=list)
    changed_cpu: list[float] = field(default_factory=list)
    """Process CPU seconds per 1k env steps of each round (the median of the arm's repeats)."""
    reasons: list[str] = field(default_factory=list)
    """Why a run was not trustworthy (its quality verdict), each once."""
    runs: int = 0
    untrustworthy_runs: int = 0
    float64_ops: tuple[int | None, int | None] = (None, None)
    host_syncs_per_step: tuple[float | None, float | None] = (None, None)
    optimizers: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def rounds(self) -> int:
        return len(self.changed)

    @property
    def trustworthy(self) -> bool:
        return not self.reasons

    def ratio(self) -> Ratio | None:
        """Changed / unchanged env steps/s (wall time)."""
        return paired_t_ratio(self.unchanged, self.changed) if self.changed else None

    def cpu_ratio(self) -> Ratio | None:
        """Unchanged / changed CPU seconds per 1k env steps: the speedup in the CPU the trainer's process used,
        which other processes' load leaves alone (None where a run gave no CPU time). Reported, never the
        verdict: on a VM the CPU time of the same work drifts over seconds (docs/tracking.md), and its tighter
        interval over a few rounds calls an identical arm faster or slower too often."""
        if not self.changed_cpu or len(self.changed_cpu) != len(self.changed):
            return None
        return paired_t_ratio(self.changed_cpu, self.unchanged_cpu)

    def add(self, base: dict[str, Any], arm: dict[str, Any]) -> None:
        self.unchanged.append(rate(base))
        self.changed.append(rate(arm))
        cpu = (_median(base, "cpu_seconds_per_1k_env_steps"), _median(arm, "cpu_seconds_per_1k_env_steps"))
        if None not in cpu:
            self.unchanged_cpu.append(cpu[0])
            self.changed_cpu.append(cpu[1])
        for answer in (base, arm):
            quality = answer["result"].get("quality") or {}
            self.runs += 1
            if not quality.get("trustworthy", True):
                self.untrustworthy_runs += 1
                self.reasons += [r for r in quality.get("reasons", []) if r not in self.reasons]
        self.float64_ops = (_stability(base, "float64_ops"), _stability(arm, "float64_ops"))
        self.host_syncs_per_step = (_metric(base, "host_syncs_per_step"), _metric(arm, "host_syncs_per_step"))
        self.optimizers = arm.get("optimizers", {})


def failure(answer: dict[str, Any]) -> str | None:
    """The one-line cause of an arm that did not give a measured run, or None."""
    if "error" in answer:
        return answer["error"]
    result = answer["result"]
    if result["status"] in ("ok", "unstable") and result.get("metrics", {}).get("env_steps_per_sec"):
        return None  # measured (an unstable run's float64 ops are reported beside its effect)
    return result.get("error") or f"the run is {result['status']}"


def rate(answer: dict[str, Any]) -> float:
    return float(answer["result"]["metrics"]["env_steps_per_sec"]["median"])


def _median(answer: dict[str, Any], key: str) -> float | None:
    block = answer["result"].get("metrics", {}).get(key)
    return float(block["median"]) if isinstance(block, dict) and block.get("median") else None


def _metric(answer: dict[str, Any], key: str) -> Any:
    return answer["result"].get("metrics", {}).get(key)


def _stability(answer: dict[str, Any], key: str) -> Any:
    return (answer["result"].get("stability") or {}).get(key)


def verdict(ratio: Ratio | None) -> str:
    """``faster`` (the interval above 1), ``slower`` (below), else the effect it could not resolve."""
    if ratio is None:
        return "not measured"
    if not power.has_power(ratio.n):
        return f"no verdict: {ratio.n} round{'s' * (ratio.n != 1)} (needs {power.MIN_REPEATS})"
    if ratio.low > 1.0:
        return "faster"
    if ratio.high < 1.0:
        return "slower"
    return f"no effect it could resolve at ±{100 * (ratio.high - ratio.low) / 2:.1f} %"


def measure(runner: ArmRunner, arms: list[Arm], rounds: int, effects: dict[str, Effect],
            say: Callable[[str], None], label: str = "round") -> None:
    """``rounds`` rounds of the unchanged trainer and ``arms`` into ``effects`` (by arm name; an arm that fails
    keeps its cause and leaves the rounds). A KeyboardInterrupt leaves the rounds finished in ``effects``."""
    unchanged = Arm(UNCHANGED)
    for name in (arm.name for arm in arms):
        effects.setdefault(name, Effect())
    for number in range(rounds):
        live = [arm for arm in arms if effects[arm.name].error is None]
        if not live:
            return
        order = [unchanged, *live] if number % 2 == 0 else [*reversed(live), unchanged]
        answers = {arm.name: runner.run(arm, "measure") for arm in order}
        base = answers[UNCHANGED]
        cause = failure(base)
        if cause is not None:
            raise UnchangedFailed(f"the unchanged trainer failed in round {number + 1}: {cause}")
        shown = [f"unchanged {rate(base):,.0f}"]
        for arm in live:
            cause = failure(answers[arm.name])
            if cause is not None:
                effects[arm.name].error = cause
                shown.append(f"{arm.name} failed")
                continue
            effects[arm.name].add(base, answers[arm.name])
            shown.append(f"{arm.name} {rate(answers[arm.name]):,.0f}")
        say(f"try: {label} {number + 1}/{rounds} (env steps/s): " + ", ".join(shown))
