"""PNG charts for ablations, sweeps and the matrix report (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .compare import Ratio  # noqa: E402


def _errors(ratios: Sequence[Ratio | None]) -> tuple[list[float], list[list[float]]]:
    values = [r.value if r else 0.0 for r in ratios]
    lows = [r.value - r.low if r else 0.0 for r in ratios]
    highs = [r.high - r.value if r else 0.0 for r in ratios]
    return values, [lows, highs]


def ablation_chart(path: Path, title: str, names: list[str], alone: list[Ratio | None],
                   in_stack: list[Ratio | None]) -> None:
    """Horizontal bars per flag: speedup alone and in the full stack, with their intervals; a line at 1.0."""
    height = 0.38
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.6 * len(names)))
    rows = list(range(len(names)))
    for offset, label, ratios in ((-height / 2, "alone (+flag / baseline)", alone),
                                  (height / 2, "in stack (all-on / -flag)", in_stack)):
        values, err = _errors(ratios)
        ax.barh([r + offset for r in rows], values, height=height, xerr=err, capsize=3, label=label)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(rows, names)
    ax.invert_yaxis()
    ax.set_xlabel("speedup (env steps/sec ratio)")
    ax.set_title(title)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def line_chart(path: Path, title: str, x_label: str, x_values: list[str],
               series: dict[str, list[tuple[float, float, float] | None]], y_label: str = "env steps/sec") -> None:
    """One line per series over categorical x values; each point (median, min, max) with a min-max bar."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = list(range(len(x_values)))
    for label, points in series.items():
        kept = [(x, p) for x, p in zip(xs, points) if p is not None]
        if not kept:
            continue
        ax.errorbar([x for x, _ in kept], [p[0] for _, p in kept],
                    yerr=[[p[0] - p[1] for _, p in kept], [p[2] - p[0] for _, p in kept]],
                    marker="o", capsize=3, label=label)
    ax.set_xticks(xs, x_values)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(series) > 1 or any(series):
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bar_chart(path: Path, title: str, names: list[str], ratios: list[Ratio | None], x_label: str) -> None:
    """Horizontal bars (one ratio each, with its interval) and a line at 1.0."""
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.5 * len(names)))
    values, err = _errors(ratios)
    ax.barh(range(len(names)), values, xerr=err, capsize=3)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel(x_label)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
