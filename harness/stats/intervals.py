"""Bootstrap intervals of throughput ratios: the one place ``compare``, ``gate``, ``calibrate`` and ``ablate`` get them.

- **paired**: round *i* of the candidate ran beside round *i* of the baseline (interleaved in
  one process); the estimate is the median of the per-round ratios ``c_i / b_i`` and the
  interval a percentile bootstrap of that median, resampling rounds.
- **paired-t**: as paired, for a handful of costly rounds: a Student-t interval on the mean log ratio;
- **independent**: two processes; the estimate is ``median(c) / median(b)`` and the interval a
  percentile bootstrap resampling each side on its own.

Both use ``RESAMPLES`` resamples from a fixed seed, so the same samples always give the same
interval. The learning statistics over seeds (interquartile means, stratified bootstrap) live
beside these in ``harness.stats.learning``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

RESAMPLES = 2000
SEED = 20240607
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Ratio:
    """``candidate / baseline`` with a confidence interval (low == high == value when there is none)."""

    value: float
    low: float
    high: float
    method: str
    """``paired`` | ``paired-t`` | ``independent`` | ``single`` (one value per run: no interval)."""
    n: int
    """Rounds (paired) or the smaller sample count (independent) behind the interval."""

    def fmt(self) -> str:
        if self.method == "single":
            return f"{self.value:.2f}x"
        return f"{self.value:.2f}x [{self.low:.2f}-{self.high:.2f}]"


def percentile_interval(estimates: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The central ``confidence`` share of bootstrap estimates (the percentile method)."""
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(estimates, [tail, 1.0 - tail])
    return float(low), float(high)


def bootstrap(samples: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray], *, resamples: int = RESAMPLES,
              seed: int = SEED) -> np.ndarray:
    """``statistic`` (applied along axis 1) of ``resamples`` resamples of ``samples`` drawn with replacement."""
    rng = np.random.default_rng(seed)
    return statistic(samples[rng.integers(0, samples.size, size=(resamples, samples.size))])


def paired_ratio(base: list[float], cand: list[float], *, confidence: float = CONFIDENCE,
                 seed: int = SEED) -> Ratio:
    """Median of the round-by-round ratios ``cand[i] / base[i]``, bootstrap interval over rounds."""
    pairs = [(b, c) for b, c in zip(base, cand) if b > 0]
    if not pairs:
        raise ValueError("no round with a positive baseline sample")
    ratios = np.array([c / b for b, c in pairs], dtype=np.float64)
    value = float(np.median(ratios))
    if len(ratios) == 1:
        return Ratio(value, value, value, "paired", 1)
    low, high = percentile_interval(bootstrap(ratios, lambda r: np.median(r, axis=1), seed=seed), confidence)
    return Ratio(value, min(low, value), max(high, value), "paired", len(ratios))


def paired_t_ratio(base: list[float], cand: list[float], *, confidence: float = CONFIDENCE) -> Ratio:
    """Median of the round-by-round ratios ``cand[i] / base[i]`` with a Student-t interval on the mean of their
    logs (widened to hold the median). Where each round is a costly unit (a fresh process per arm: ``rlgauge
    try``), a bootstrap of 3-4 ratios is only their range (about 75 % coverage at 3); the t interval keeps its
    level at a handful of rounds."""
    from scipy import stats

    pairs = [(b, c) for b, c in zip(base, cand) if b > 0 and c > 0]
    if not pairs:
        raise ValueError("no round with positive samples on both sides")
    logs = np.log(np.array([c / b for b, c in pairs], dtype=np.float64))
    value = float(np.exp(np.median(logs)))
    if len(logs) == 1:
        return Ratio(value, value, value, "paired-t", 1)
    half = float(stats.t.ppf(0.5 + confidence / 2.0, len(logs) - 1) * logs.std(ddof=1) / np.sqrt(len(logs)))
    low, high = float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))
    return Ratio(value, min(low, value), max(high, value), "paired-t", len(logs))


def independent_ratio(base: list[float], cand: list[float], *, confidence: float = CONFIDENCE,
                      seed: int = SEED) -> Ratio:
    """``median(cand) / median(base)`` with a bootstrap interval resampling each side on its own."""
    b, c = np.asarray(base, dtype=np.float64), np.asarray(cand, dtype=np.float64)
    if b.size == 0 or c.size == 0 or np.median(b) <= 0:
        raise ValueError("need samples on both sides and a positive baseline median")
    value = float(np.median(c) / np.median(b))
    if b.size == 1 and c.size == 1:
        return Ratio(value, value, value, "independent", 1)
    rng = np.random.default_rng(seed)
    mb = np.median(b[rng.integers(0, b.size, size=(RESAMPLES, b.size))], axis=1)
    mc = np.median(c[rng.integers(0, c.size, size=(RESAMPLES, c.size))], axis=1)
    low, high = percentile_interval(mc / mb, confidence)
    return Ratio(value, min(low, value), max(high, value), "independent", int(min(b.size, c.size)))


def single_ratio(base: float, cand: float) -> Ratio:
    """A ratio of two single values: no interval."""
    return Ratio(cand / base, cand / base, cand / base, "single", 1)
