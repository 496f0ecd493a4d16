"""Learning statistics over seeds, the field's way (Agarwal et al., NeurIPS 2021, through ``rliable``).

Scores are arrays of shape ``(runs, tasks)``: one row per seed, one column per task (a preset).
- the **interquartile mean** (IQM): the mean of the middle 50 % of all runs' scores
  (``rliable.metrics.aggregate_iqm``), robust to one lucky or failed seed;
- **stratified bootstrap** intervals: seeds resampled with replacement within each task, each
  arm on its own (``rliable.library.StratifiedIndependentBootstrap``), percentile method;
- the **probability of improvement** ``P(X > Y)`` (Mann-Whitney, averaged over tasks);
- **performance profiles**: the share of runs whose normalised score exceeds each threshold.

Scores of several tasks are normalised before they are pooled (``normalise``): each task's
scores divided by the magnitude of the reference arm's IQM on that task, so 1.0 is the
reference's score on every task (as rliable pools human-normalised Atari scores). rliable draws
its resamples from NumPy's global RNG; ``_seeded`` seeds it for the call and restores it, so the
same scores always give the same interval.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
SEED = 0
CONFIDENCE = 0.95


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """NumPy's global RNG seeded inside the block (rliable samples from it), restored after."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def as_scores(values: object) -> np.ndarray:
    """A ``(runs, tasks)`` float array: a flat list of per-seed values is one task."""
    scores = np.asarray(values, dtype=np.float64)
    return scores.reshape(-1, 1) if scores.ndim == 1 else scores


def iqm(scores: object) -> float:
    """The interquartile mean over every run and task (rliable's ``aggregate_iqm``)."""
    from rliable import metrics

    return float(metrics.aggregate_iqm(as_scores(scores)))


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its stratified bootstrap interval."""

    value: float
    low: float
    high: float

    @property
    def half_width(self) -> float:
        """The larger distance from the estimate to an end of its interval."""
        return max(self.high - self.value, self.value - self.low)


def _interval(func: object, *arrays: np.ndarray, resamples: int, confidence: float, seed: int) -> Estimate:
    from rliable import library

    with _seeded(seed):
        bootstrap = library.StratifiedIndependentBootstrap(*arrays)
        low, high = bootstrap.conf_int(func, reps=resamples, size=confidence, method="percentile")[:, 0]
    value = float(func(*arrays)[0])  # type: ignore[operator]
    return Estimate(value, float(min(low, value)), float(max(high, value)))


def iqm_difference(first: object, second: object, *, resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
                   seed: int = SEED) -> Estimate:
    """``IQM(first) - IQM(second)`` with a stratified bootstrap interval, each arm's seeds resampled on their own
    (two arms' runs are independent, whatever their seed numbers)."""
    from rliable import metrics

    a, b = as_scores(first), as_scores(second)
    if a.size == 0 or b.size == 0 or a.shape[1] != b.shape[1]:
        raise ValueError(f"need runs on both sides over the same tasks; got {a.shape} and {b.shape}")
    func = lambda x, y: np.array([metrics.aggregate_iqm(x) - metrics.aggregate_iqm(y)])  # noqa: E731
    return _interval(func, a, b, resamples=resamples, confidence=confidence, seed=seed)


def iqm_interval(scores: object, *, resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
                 seed: int = SEED) -> Estimate:
    """One arm's IQM with its stratified bootstrap interval."""
    from rliable import metrics

    func = lambda x: np.array([metrics.aggregate_iqm(x)])  # noqa: E731
    return _interval(func, as_scores(scores), resamples=resamples, confidence=confidence, seed=seed)


def probability_of_improvement(first: object, second: object, *, resamples: int = RESAMPLES,
                               confidence: float = CONFIDENCE, seed: int = SEED) -> Estimate:
    """``P(first > second)``: the chance a run of ``first`` beats one of ``second`` (0.5: alike), averaged over
    tasks, with its stratified bootstrap interval (rliable's ``probability_of_improvement``)."""
    from rliable import metrics

    func = lambda x, y: np.array([metrics.probability_of_improvement(x, y)])  # noqa: E731
    return _interval(func, as_scores(first), as_scores(second), resamples=resamples, confidence=confidence,
                     seed=seed)


def normalise(scores: Mapping[str, object], reference: str) -> dict[str, np.ndarray]:
    """Every arm's ``(runs, tasks)`` scores divided per task by ``|IQM|`` of ``reference``'s scores on that task.

    ``ValueError`` when the reference's IQM on a task is 0 (nothing to scale by)."""
    arrays = {name: as_scores(values) for name, values in scores.items()}
    ref = arrays[reference]
    scale = np.array([abs(iqm(ref[:, task])) for task in range(ref.shape[1])])
    if not np.all(scale > 0):
        raise ValueError(f"{reference}'s interquartile mean is 0 on a task: scores cannot be normalised by it")
    return {name: values / scale for name, values in arrays.items()}


def performance_profile(scores: Mapping[str, object], taus: object, *, resamples: int = 1000,
                        confidence: float = CONFIDENCE, seed: int = SEED) -> dict[str, dict[str, list[float]]]:
    """Per arm, the share of runs with a score above each threshold in ``taus``, with its stratified bootstrap
    band (rliable's ``create_performance_profile``)."""
    from rliable import library

    arrays = {name: as_scores(values) for name, values in scores.items()}
    with _seeded(seed):
        profiles, bands = library.create_performance_profile(arrays, np.asarray(taus, dtype=np.float64),
                                                             reps=resamples, confidence_interval_size=confidence)
    return {name: {"share": [float(v) for v in profiles[name]], "low": [float(v) for v in bands[name][0]],
                   "high": [float(v) for v in bands[name][1]]} for name in arrays}
