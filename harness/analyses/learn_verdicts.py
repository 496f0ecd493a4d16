"""``learn``'s curves on a grid, each seed's scores, and the verdicts with their margins.

The curves are resampled onto a common grid of env steps (a step function: the last value at or
before each point). Two scores per seed and arm: the **final return** (the mean of its curve
over the last ``FINAL_FRACTION`` of the grid) and the **area under the curve** (the mean over
the whole grid), both over the grid points where every compared curve has a value. A
comparison (first arm against second, on a task or pooled over tasks) is made on scores
normalised by the second arm's interquartile mean on each task (1.0 = the second arm's score):
the difference of the arms' IQMs with its stratified bootstrap interval (``harness.stats.learning``),
the probability of improvement, and a verdict against a margin in percent of the second arm's
score (``harness.stats.verdicts``). Only seeds every compared arm finished take part.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.errors import UserError
from harness.stats import learning, power, verdicts

GRID_POINTS = 50
FINAL_FRACTION = 0.1
"""Share of the grid (its end) averaged into the final return."""
METRICS = {"final_return": "final return", "auc": "area under curve"}
DEFAULT_MARGIN_PCT = {"final_return": 39.0, "auc": 8.0}
"""The default margin of each metric, in percent of the second arm's score: what an A/A campaign of 16 seeds
resolves at the between-seed spread measured on ppo-cartpole-sb3 (docs/analysis.md, "Margins")."""
ALL_TASKS = "all tasks"


# --------------------------------------------------------------------------- curves on a grid

def make_grid(steps: int, points: int = GRID_POINTS) -> list[int]:
    """``points`` env-step counts evenly spaced up to ``steps`` (fewer when ``steps`` is smaller)."""
    return sorted({round(steps * (i + 1) / points) for i in range(points)} - {0})


def on_grid(points: Sequence[tuple[int, float | None]], grid: Sequence[int]) -> list[float | None]:
    """A curve as a step function at each grid point: the last value recorded at or before it; None before
    the first record, while it is None (no episode finished yet), and past the curve's last record."""
    steps = [s for s, _ in points]
    values: list[float | None] = []
    for at in grid:
        i = bisect_right(steps, at) - 1
        values.append(None if i < 0 or at > steps[-1] else points[i][1])
    return values


def aggregate(rows: Sequence[Sequence[float | None]]) -> dict[str, list[Any]]:
    """Median and 25/75 % per grid point over the rows that have a value there (``n`` of them)."""
    table = np.array(rows, dtype=np.float64).reshape(len(rows), -1)
    out: dict[str, list[Any]] = {"median": [], "q25": [], "q75": [], "n": []}
    for column in table.T:
        values = column[np.isfinite(column)]
        out["n"].append(int(values.size))
        low, mid, high = np.percentile(values, [25, 50, 75]) if values.size else (None, None, None)
        for key, value in (("q25", low), ("median", mid), ("q75", high)):
            out[key].append(None if value is None else float(value))
    return out


def final_count(points: int) -> int:
    """Grid points at the end averaged into the final return."""
    return max(1, round(FINAL_FRACTION * points))


def seed_scores(rows_first: Sequence[Sequence[float | None]], rows_second: Sequence[Sequence[float | None]],
                grid_size: int) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
    """Per metric: each arm's per-seed scores and the grid points they average (0: none usable)."""
    a = np.array(rows_first, dtype=np.float64).reshape(len(rows_first), grid_size)
    b = np.array(rows_second, dtype=np.float64).reshape(len(rows_second), grid_size)
    support = np.isfinite(a).all(axis=0) & np.isfinite(b).all(axis=0)
    tail = np.zeros(grid_size, dtype=bool)
    tail[grid_size - final_count(grid_size):] = True
    out = {}
    for metric, columns in (("final_return", support & tail), ("auc", support)):
        count = int(columns.sum())
        out[metric] = (a[:, columns].mean(axis=1) if count else a[:, :0].sum(axis=1),
                       b[:, columns].mean(axis=1) if count else b[:, :0].sum(axis=1), count)
    return out


# --------------------------------------------------------------------------- margins

def parse_margins(text: str | None) -> dict[str, float]:
    """``--margin PCT`` (every metric) or ``--margin final_return=PCT,auc=PCT``; the defaults for the rest."""
    margins = dict(DEFAULT_MARGIN_PCT)
    if text is None:
        return margins
    accepted = (f"accepted: a positive percentage of the second arm's score (e.g. --margin 10), or per metric "
                f"{','.join(f'{m}=PCT' for m in METRICS)}")
    items = [item.strip() for item in text.split(",")]
    pairs = [item.partition("=") for item in items]
    if len(items) == 1 and not pairs[0][1]:
        pairs = [(metric, "=", items[0]) for metric in METRICS]
    for metric, sign, value in pairs:
        if not sign or metric not in METRICS:
            raise UserError(f"--margin {text}: {metric!r} is not a metric; {accepted}")
        try:
            margins[metric] = verdicts.check_margin(float(value.rstrip("%")))
        except ValueError:
            raise UserError(f"--margin {text}: {value!r} is not a positive number; {accepted}") from None
    return margins


# --------------------------------------------------------------------------- comparisons

def comparisons(arms: Sequence[str], reference: str, peer: str | None) -> list[tuple[str, str]]:
    """Each of our arms against the peer, then each other arm against the reference (``baseline``)."""
    ours = [arm for arm in arms if arm != peer]
    pairs = [(arm, peer) for arm in reversed(ours)] if peer is not None else []
    return [*pairs, *((arm, reference) for arm in ours if arm != reference)]


def compare(first: str, second: str, by_task: dict[str, tuple[list, list]], grid_size: int,
            margins: dict[str, float]) -> list[dict[str, Any]]:
    """The verdict rows of ``first`` against ``second``: per task, and pooled over tasks when there are several
    (``by_task``: each task's complete seeds' grid values of both arms)."""
    rows = []
    scores = {task: seed_scores(a, b, grid_size) for task, (a, b) in by_task.items()}
    for metric in METRICS:
        for task, per_metric in scores.items():
            first_scores, second_scores, points = per_metric[metric]
            rows.append(_row(first, second, metric, task, [first_scores], [second_scores], points, margins[metric]))
        if len(scores) > 1:
            usable = [s[metric] for s in scores.values()]
            rows.append(_row(first, second, metric, ALL_TASKS, [u[0] for u in usable], [u[1] for u in usable],
                             min(u[2] for u in usable), margins[metric]))
    return rows


def _row(first: str, second: str, metric: str, task: str, first_scores: list[np.ndarray],
         second_scores: list[np.ndarray], points: int, margin: float) -> dict[str, Any]:
    """One comparison on one task (one array per task: several are pooled, at the seeds every task has)."""
    n_first, n_second = min(len(s) for s in first_scores), min(len(s) for s in second_scores)
    row: dict[str, Any] = {"first": first, "second": second, "metric": metric, "task": task,
                           "seeds": [n_first, n_second], "grid_points": points, "margin_pct": margin}
    fewest = min(n_first, n_second)
    if fewest < 2:
        row["verdict"] = "no verdict: fewer than 2 complete seeds"
        return row
    if points == 0:
        row["verdict"] = "no verdict: no grid point where every curve has a value"
        return row
    a = np.stack([s[:n_first] for s in first_scores], axis=1)
    b = np.stack([s[:n_second] for s in second_scores], axis=1)
    try:
        normalised = learning.normalise({"first": a, "second": b}, "second")
    except ValueError:
        row["verdict"] = f"no verdict: {second}'s score is 0, the margin (a share of it) is undefined"
        return row
    diff = learning.iqm_difference(normalised["first"], normalised["second"])
    improvement = learning.probability_of_improvement(a, b, resamples=learning.RESAMPLES // 2)
    pct = [100.0 * v for v in (diff.value, diff.low, diff.high)]
    row.update(difference_pct=pct[0], low_pct=pct[1], high_pct=pct[2],
               probability_of_improvement={"value": improvement.value, "low": improvement.low,
                                           "high": improvement.high})
    if a.shape[1] == 1:  # one task: the difference in the return's own units too
        scale = abs(learning.iqm(b))
        row.update(iqm_first=learning.iqm(a), iqm_second=learning.iqm(b),
                   difference=diff.value * scale, low=diff.low * scale, high=diff.high * scale)
    if not power.has_power(fewest):
        row["verdict"] = no_verdict(fewest)
        return row
    judged = verdicts.judge(pct[0], pct[1], pct[2], margin, fewest)
    row.update(verdict=judged.word, verdict_text=judged.text(margin, " %"), seeds_needed=judged.seeds_needed,
               question=verdicts.QUESTIONS[judged.word])
    return row


def no_verdict(seeds: int) -> str:
    """The verdict with too few seeds: a bootstrap of two seeds only spans the pairs' differences."""
    return f"no verdict: {seeds} seeds (needs {power.MIN_REPEATS})"


def performance_profile(finals: dict[str, list[np.ndarray]], reference: str, points: int = 21) -> dict[str, Any]:
    """Final returns normalised per task by the reference arm's IQM, as rliable's score distributions: the share
    of runs above each threshold (with its band), per arm; {} when there is nothing to normalise by."""
    runs = min(len(values) for per_task in finals.values() for values in per_task)
    if runs < 2:
        return {}
    arrays = {arm: np.stack([v[:runs] for v in per_task], axis=1) for arm, per_task in finals.items()}
    try:
        normalised = learning.normalise(arrays, reference)
    except ValueError:
        return {}
    top = max(1.0, max(float(v.max()) for v in normalised.values()))
    taus = np.linspace(0.0, top, points)
    return {"metric": "final_return", "normalised_by": reference, "taus": [float(t) for t in taus],
            "arms": learning.performance_profile(normalised, taus)}
