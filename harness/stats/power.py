"""When a comparison may give a verdict, and the smallest effect it could have seen.

A verdict (helps / hurts, faster / slower, regression) needs at least ``MIN_REPEATS``
samples on each side: with two, a bootstrap "interval" is only the range of two ratios. With
enough repeats, a verdict states its resolution: the half-width of its confidence interval
relative to the estimate. An effect smaller than that cannot be told from noise by this run.
``ablate``, ``compare``, ``sweep``, ``gate`` and ``calibrate`` all use these rules.
"""

from __future__ import annotations

from typing import Protocol

MIN_REPEATS = 3
"""Fewest repeats (paired rounds, or samples per side) behind any verdict."""


class _Interval(Protocol):
    value: float
    low: float
    high: float
    n: int


def has_power(n: int) -> bool:
    """True when ``n`` repeats are enough for a verdict."""
    return n >= MIN_REPEATS


def no_verdict(n: int) -> str:
    """The words shown instead of a verdict for ``n`` repeats."""
    return f"no verdict: {n} repeat{'s' * (n != 1)} (needs {MIN_REPEATS})"


def resolution_pct(ratio: _Interval) -> float:
    """The smallest effect this comparison could have detected, in percent of the estimate:
    the larger distance from the estimate to either end of its interval."""
    if ratio.value <= 0:
        return float("inf")
    return 100.0 * max(ratio.high - ratio.value, ratio.value - ratio.low) / ratio.value


def resolution_note(ratio: _Interval) -> str:
    """``resolves +/-4.2 %`` for a ratio with an interval."""
    return f"resolves +/-{resolution_pct(ratio):.1f} %"
