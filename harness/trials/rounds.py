"""What a try measures of one arm beside the unchanged trainer (``Effect``), and its verdict. The pairs come from
alternating slices of live processes (``slices``); the checks (float64 ops, host syncs) from each arm's process
once its warm-up is done.

The round (a fresh process per arm) is the statistical unit: pairs from one pair of processes share that
process's luck (where the allocator put things, which cores it got), so they are not independent draws. Each
round gives one value, the geometric mean of its pairs' ratios; the interval is a Student-t interval over the
rounds' values (``paired_t_ratio`` on one value per round)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.stats import power
from harness.stats.intervals import CONFIDENCE, Ratio, paired_t_ratio

UNCHANGED = "unchanged"
DEFAULT_ROUNDS = 5
"""Rounds of fresh processes (one per arm); each gives ``slices.CYCLES`` pairs per arm, and one value."""
MIN_ROUNDS = power.MIN_REPEATS
"""Fewest rounds behind a verdict, and before the measurement may stop early."""
INTERIM_CONFIDENCE = 0.99
"""The level an interval must be decisive at for the measurement to stop before its last round: stricter than the
verdict's 95 %, so that looking after each round adds at most 1 % of false verdicts per look (Haybittle-Peto)."""
DISTURBED = 0.25
"""A pair whose two unchanged slices differ by more than this (relative) saw the machine change speed."""


class UnchangedFailed(Exception):
    """The unchanged trainer failed: nothing can be compared with it."""


@dataclass
class Effect:
    """One arm's pairs beside the unchanged trainer's."""

    unchanged: list[float] = field(default_factory=list)
    """Env steps/s of the unchanged slices around each pair (their mean)."""
    changed: list[float] = field(default_factory=list)
    unchanged_cpu: list[float] = field(default_factory=list)
    changed_cpu: list[float] = field(default_factory=list)
    """Process CPU seconds per 1k env steps of each pair's slices."""
    disturbed: int = 0
    """Pairs whose two unchanged slices differed by more than ``DISTURBED``."""
    float64_ops: tuple[int | None, int | None] = (None, None)
    host_syncs_per_step: tuple[float | None, float | None] = (None, None)
    optimizers: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    log: str | None = None
    """The log of the process whose failure is ``error``."""
    round_of: list[int] = field(default_factory=list)
    """The round of each pair."""

    @property
    def pairs(self) -> int:
        return len(self.changed)

    @property
    def reasons(self) -> list[str]:
        """Why the pairs are not trustworthy: the machine changed speed within more than a third of them."""
        if self.pairs and self.disturbed * 3 > self.pairs:
            return [f"the machine's speed changed by more than {DISTURBED:.0%} within {self.disturbed} of "
                    f"{self.pairs} pairs (the unchanged slices around them disagreed)"]
        return []

    @property
    def trustworthy(self) -> bool:
        return not self.reasons

    @property
    def rounds(self) -> int:
        return len(set(self.round_of))

    def ratio(self, confidence: float = CONFIDENCE) -> Ratio | None:
        """Changed / unchanged env steps/s (wall time): one value per round, a t interval over rounds."""
        return _over_rounds(self.round_of, self.unchanged, self.changed, confidence) if self.changed else None

    def cpu_ratio(self) -> Ratio | None:
        """Unchanged / changed CPU seconds per 1k env steps: the speedup in the CPU the trainer's process used
        (None where a slice gave no CPU time). Reported, never the verdict: a change of threads moves CPU time
        and wall time apart."""
        if not self.changed_cpu or len(self.changed_cpu) != len(self.changed):
            return None
        return _over_rounds(self.round_of, self.changed_cpu, self.unchanged_cpu, CONFIDENCE)

    def decisive(self) -> bool:
        """Already faster or slower at ``INTERIM_CONFIDENCE`` after at least ``MIN_ROUNDS`` rounds."""
        ratio = self.ratio(INTERIM_CONFIDENCE)
        return ratio is not None and ratio.n >= MIN_ROUNDS and (ratio.low > 1.0 or ratio.high < 1.0)

    def add_pair(self, before: dict[str, Any], changed: dict[str, Any], after: dict[str, Any],
                 round_index: int = 0) -> None:
        """One changed slice between two unchanged ones (each ``{"env_steps", "wall", "cpu"}``) in a round."""
        self.round_of.append(round_index)
        around = (_rate(before), _rate(after))
        self.unchanged.append(sum(around) / 2)
        self.changed.append(_rate(changed))
        if abs(around[0] - around[1]) > DISTURBED * max(around):
            self.disturbed += 1
        cpu = [_cpu_per_1k(s) for s in (before, after, changed)]
        if all(c > 0 for c in cpu):
            self.unchanged_cpu.append((cpu[0] + cpu[1]) / 2)
            self.changed_cpu.append(cpu[2])

    def add_checks(self, base: dict[str, Any], arm: dict[str, Any]) -> None:
        """The checks each process ran after its warm-up (``{"float64_ops", "host_syncs_per_step"}``)."""
        self.float64_ops = (base.get("float64_ops"), arm.get("float64_ops"))
        self.host_syncs_per_step = (base.get("host_syncs_per_step"), arm.get("host_syncs_per_step"))
        self.optimizers = arm.get("optimizers", {}) or self.optimizers


def _over_rounds(round_of: list[int], base: list[float], cand: list[float], confidence: float) -> Ratio:
    """``cand / base``: the geometric mean of each round's pair ratios, then a t interval over those (``n``: rounds;
    pairs without a round are one round)."""
    import math

    logs: dict[int, list[float]] = {}
    for index, (b, c) in enumerate(zip(base, cand)):
        if b > 0 and c > 0:
            logs.setdefault(round_of[index] if index < len(round_of) else 0, []).append(math.log(c / b))
    per_round = [math.exp(sum(v) / len(v)) for v in logs.values()]
    return paired_t_ratio([1.0] * len(per_round), per_round, confidence=confidence)


def _rate(piece: dict[str, Any]) -> float:
    return float(piece["env_steps"]) / max(float(piece["wall"]), 1e-9)


def _cpu_per_1k(piece: dict[str, Any]) -> float:
    return 1000.0 * float(piece["cpu"]) / max(float(piece["env_steps"]), 1.0)


def verdict(ratio: Ratio | None) -> str:
    """``faster`` (the interval above 1), ``slower`` (below), else the effect it could not resolve."""
    if ratio is None:
        return "not measured"
    if ratio.n < MIN_ROUNDS:
        return f"no verdict: {ratio.n} round{'s' * (ratio.n != 1)} (needs {MIN_ROUNDS})"
    if ratio.low > 1.0:
        return "faster"
    if ratio.high < 1.0:
        return "slower"
    return f"no effect it could resolve at ±{100 * (ratio.high - ratio.low) / 2:.1f} %"
