"""Verdicts that answer a stated question: is the difference inside a margin, below zero, above it?

Given the interval ``[low, high]`` of a difference (first arm minus second) and a margin ``m > 0``:

- **same learning (within +-m)**: the whole interval lies inside ``(-m, +m)``: evidence of
  sameness, not only absence of evidence of a difference (an equivalence test, as two one-sided
  tests at the interval's level);
- **learns less** / **learns more**: the whole interval lies below / above zero;
- **inconclusive**: neither. The seeds that would resolve it are estimated from the observed
  spread: an interval's half-width shrinks as ``1/sqrt(seeds)``, so ``n * (hw / target)^2`` seeds
  reach a half-width ``target``: ``m - |d|`` to fit inside the margin when the estimate ``d`` lies
  inside it, else ``|d|`` to exclude zero.

A difference can be both "learns less" and beyond the margin; "learns less" is what is reported
(a shortfall confirmed is the stronger statement). ``power.MIN_REPEATS`` seeds per arm are needed
for any verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.stats import power

SAME, LESS, MORE, INCONCLUSIVE = "same learning", "learns less", "learns more", "inconclusive"
QUESTIONS = {
    SAME: "is the whole interval inside +-margin? (evidence the arms learn alike)",
    LESS: "is the whole interval below 0? (a confirmed shortfall of the first arm)",
    MORE: "is the whole interval above 0? (a confirmed lead of the first arm)",
    INCONCLUSIVE: "neither: the seeds cannot tell; more seeds would",
}


@dataclass(frozen=True)
class Verdict:
    """The answer, in words, and for an inconclusive one the seeds per arm that would likely resolve it."""

    word: str
    seeds_needed: int | None = None

    def text(self, margin: float, unit: str = "") -> str:
        if self.word == SAME:
            return f"{SAME} (within +-{margin:g}{unit})"
        if self.word == INCONCLUSIVE and self.seeds_needed is not None:
            return f"{INCONCLUSIVE} (~{self.seeds_needed} seeds would resolve +-{margin:g}{unit})"
        return self.word


def check_margin(margin: float, name: str = "--margin") -> float:
    """``margin`` if it is a finite positive number, else ``ValueError`` naming what is accepted."""
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin <= 0:
        raise ValueError(f"{name} {margin!r}: accepted: a positive number")
    return float(margin)


def judge(value: float, low: float, high: float, margin: float, seeds: int) -> Verdict:
    """The verdict of a difference ``value`` with interval ``[low, high]`` from ``seeds`` seeds per arm."""
    check_margin(margin, "margin")
    if high < 0:
        return Verdict(LESS)
    if low > 0:
        return Verdict(MORE)
    if -margin < low and high < margin:
        return Verdict(SAME)
    return Verdict(INCONCLUSIVE, seeds_to_resolve(value, low, high, margin, seeds))


def seeds_to_resolve(value: float, low: float, high: float, margin: float, seeds: int) -> int | None:
    """Seeds per arm at which the observed spread would give a half-width that settles the question (see the
    module's docstring); None when the interval has no width to scale."""
    half = max(high - value, value - low)
    target = margin - abs(value) if abs(value) < margin else abs(value)
    if half <= 0 or target <= 0:
        return None
    return max(seeds + 1, power.MIN_REPEATS, math.ceil(seeds * (half / target) ** 2))
