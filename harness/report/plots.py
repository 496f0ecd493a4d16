"""PNG charts for ablations, sweeps, learning curves and the matrix report (matplotlib, headless Agg backend).

Charts are drawn so that they cannot mislead:

- ratios (speedups) are bars from the 1.0x line on a log axis, since ratios are multiplicative
  (0.5x and 2x lie equally far from 1); slowdowns, speedups and ratios whose interval holds 1
  (or that have too few repeats for a verdict) each get their own colour;
- throughput of unrelated categories (presets, non-numeric values) is grouped bars, never a
  line between them; only a sweep over numeric values draws a line;
- every throughput axis starts at 0, so a small difference is drawn as small.
- learning curves show the median over seeds with its interquartile band, so the spread
  between seeds is drawn with the middle.

Each function saves its PNG and returns the Figure (closed to pyplot, still inspectable).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

from reference_trainers.state.atomic_file import write_atomically

from harness.stats.compare import Ratio
from harness.stats.power import has_power

SPEEDUP_COLOR = "#2a9d4b"
SLOWDOWN_COLOR = "#d1495b"
NEUTRAL_COLOR = "#9e9e9e"
"""Interval holds 1.0x, or too few repeats for a verdict: neither faster nor slower."""
RATIO_TICKS = (0.1, 0.2, 0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 10.0)
MIN_RATIO_SPAN = 1.25
"""The ratio axis shows at least 1/1.25x .. 1.25x, so a tiny effect stays visibly tiny."""

Triple = tuple[float, float, float]
"""(median, min, max) of one throughput."""


def ratio_color(ratio: Ratio) -> str:
    """Green for a speedup, red for a slowdown, grey when the interval holds 1.0 or power is lacking."""
    has_interval = ratio.method != "single"
    if has_interval and (not has_power(ratio.n) or ratio.low <= 1.0 <= ratio.high):
        return NEUTRAL_COLOR
    if ratio.value == 1.0:
        return NEUTRAL_COLOR
    return SPEEDUP_COLOR if ratio.value > 1.0 else SLOWDOWN_COLOR


def _finish(fig: Figure, path: Path) -> Figure:
    fig.tight_layout()
    fmt = Path(path).suffix.lstrip(".") or "png"
    try:
        write_atomically(Path(path), lambda handle: fig.savefig(handle, dpi=110, format=fmt))  # the one safe writer
    finally:
        plt.close(fig)
    return fig


def _ratio_axis(ax: Axes, ratios: Sequence[Ratio | None], label: str) -> None:
    """Log x axis symmetric about 1.0x (in log terms), labelled ``0.5x``, ``2x``, with the 1.0x line."""
    ends = [v for r in ratios if r for v in (r.value, r.low, r.high) if v > 0]
    span = max([MIN_RATIO_SPAN] + [max(v, 1.0 / v) for v in ends]) * 1.15
    ax.set_xscale("log")
    ax.set_xlim(1.0 / span, span)
    ax.xaxis.set_major_locator(FixedLocator([t for t in RATIO_TICKS if 1.0 / span <= t <= span]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}x"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.axvline(1.0, color="black", linewidth=1)
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel(f"{label} (log scale; < 1x is slower)")


def _ratio_bars(ax: Axes, rows: Sequence[float], ratios: Sequence[Ratio | None], height: float,
                hatch: str | None = None) -> None:
    """Bars from 1.0x to each ratio (so slowdowns point left), interval whiskers, the value written."""
    for row, ratio in zip(rows, ratios):
        if ratio is None or ratio.value <= 0:
            ax.text(1.0, row, "  no data", va="center", ha="left", fontsize="small", color="dimgray")
            continue
        ax.barh(row, ratio.value - 1.0, left=1.0, height=height, color=ratio_color(ratio), hatch=hatch,
                edgecolor="black", linewidth=0.5)
        if ratio.method != "single":
            ax.errorbar(ratio.value, row, xerr=[[ratio.value - ratio.low], [ratio.high - ratio.value]],
                        fmt="none", ecolor="black", capsize=3, linewidth=1)
        end = max(ratio.value, ratio.high) if ratio.value >= 1.0 else min(ratio.value, ratio.low)
        ax.text(end, row, f" {ratio.value:.2f}x ", va="center", ha="left" if ratio.value >= 1.0 else "right",
                fontsize="small")


def _direction_legend(extra: Sequence[Patch] = ()) -> list[Patch]:
    return [Patch(color=SPEEDUP_COLOR, label="faster"), Patch(color=SLOWDOWN_COLOR, label="slower"),
            Patch(color=NEUTRAL_COLOR, label="interval holds 1x\nor too few repeats"), *extra]


def _outside_legend(ax: Axes, handles: list[Patch]) -> None:
    """Legend right of the axes, where it cannot hide a bar."""
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", borderaxespad=0)


def ablation_chart(path: Path, title: str, names: list[str], alone: list[Ratio | None],
                   in_stack: list[Ratio | None]) -> Figure:
    """Per flag, two bars from 1.0x on a log axis: the speedup alone (solid) and in the full stack (hatched)."""
    height = 0.38
    fig, ax = plt.subplots(figsize=(10, max(3.2, 1.6 + 0.6 * len(names))))
    rows = list(range(len(names)))
    _ratio_bars(ax, [r - height / 2 for r in rows], alone, height)
    _ratio_bars(ax, [r + height / 2 for r in rows], in_stack, height, hatch="//")
    _ratio_axis(ax, list(alone) + list(in_stack), "speedup (env steps/sec ratio)")
    ax.set_yticks(rows, names)
    ax.set_ylim(len(names) - 0.5, -0.5)  # first flag on top
    ax.set_title(title)
    arms = [Patch(facecolor="white", edgecolor="black", label="alone (+flag / baseline)"),
            Patch(facecolor="white", edgecolor="black", hatch="//", label="in stack (all-on / -flag)")]
    _outside_legend(ax, _direction_legend(arms))
    return _finish(fig, path)


def bar_chart(path: Path, title: str, names: list[str], ratios: list[Ratio | None], x_label: str) -> Figure:
    """One bar per ratio from 1.0x on a log axis, coloured by direction, with its interval."""
    fig, ax = plt.subplots(figsize=(10, max(2.8, 1.6 + 0.5 * len(names))))
    rows = list(range(len(names)))
    _ratio_bars(ax, rows, ratios, 0.6)
    _ratio_axis(ax, ratios, x_label)
    ax.set_yticks(rows, names)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_title(title)
    _outside_legend(ax, _direction_legend())
    return _finish(fig, path)


def _zero_based(ax: Axes, y_label: str) -> None:
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"{y_label} (axis from 0)")
    ax.grid(axis="y", alpha=0.3)


def grouped_bar_chart(path: Path, title: str, x_label: str, groups: list[str],
                      series: dict[str, list[Triple | None]], y_label: str = "env steps/sec") -> Figure:
    """One group per category, one bar per series (median, min-max whisker); y axis from 0."""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 + 0.5 * len(groups) * max(1, len(series))), 4.5))
    width = 0.8 / max(1, len(series))
    for index, (label, points) in enumerate(series.items()):
        xs = [g - 0.4 + width * (index + 0.5) for g in range(len(groups))]
        medians = [p[0] if p else 0.0 for p in points]
        err = [[p[0] - p[1] if p else 0.0 for p in points], [p[2] - p[0] if p else 0.0 for p in points]]
        ax.bar(xs, medians, width=width, yerr=err, capsize=3, label=label, edgecolor="black", linewidth=0.5)
        for x, p in zip(xs, points):
            if p is None:
                ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize="x-small", rotation=90)
    tilt = len(groups) > 4  # long preset names overlap side by side
    ax.set_xticks(range(len(groups)), groups, rotation=20 if tilt else 0, ha="right" if tilt else "center")
    ax.set_xlabel(x_label)
    _zero_based(ax, y_label)
    ax.set_title(title)
    if series:
        ax.legend(loc="best", fontsize="small")
    return _finish(fig, path)


def numeric_values(values: Sequence[str]) -> list[float] | None:
    """The values as numbers when every one is a finite int/float literal (not a bool), else None."""
    numbers = []
    for text in values:
        try:
            number = float(text)
        except ValueError:
            return None
        if not math.isfinite(number):
            return None
        numbers.append(number)
    return numbers


def sweep_chart(path: Path, title: str, x_label: str, x_values: list[str],
                series: dict[str, list[Triple | None]], y_label: str = "env steps/sec") -> Figure:
    """Numeric x values: a line per series over the sorted values (log x axis when they span 10x or
    more), median with min-max whiskers, y axis from 0. Other values: grouped bars."""
    numbers = numeric_values(x_values)
    if numbers is None or len(set(numbers)) < len(numbers) or len(numbers) < 2:
        return grouped_bar_chart(path, title, x_label, x_values, series, y_label)
    order = sorted(range(len(numbers)), key=numbers.__getitem__)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, points in series.items():
        kept = [(numbers[i], points[i]) for i in order if points[i] is not None]
        if not kept:
            continue
        ax.errorbar([x for x, _ in kept], [p[0] for _, p in kept],
                    yerr=[[p[0] - p[1] for _, p in kept], [p[2] - p[0] for _, p in kept]],
                    marker="o", capsize=3, label=label)
    positive = all(n > 0 for n in numbers)
    if positive and max(numbers) / min(numbers) >= 10:
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks([numbers[i] for i in order], [x_values[i] for i in order])
    ax.set_xlabel(x_label)
    _zero_based(ax, y_label)
    ax.set_title(title)
    if series:
        ax.legend(loc="best", fontsize="small")
    return _finish(fig, path)


Band = tuple[Sequence[float | None], Sequence[float | None], Sequence[float | None]]
"""(median, 25 %, 75 %) per x value; None where no seed has a value."""


def learning_chart(path: Path, title: str, x_values: Sequence[int], series: dict[str, Band], y_label: str) -> Figure:
    """Per series, the median and its interquartile band over seeds against env steps, drawn as the step
    functions they are (gaps where None)."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, (median, low, high) in series.items():
        def values(column: Sequence[float | None]) -> list[float]:
            return [math.nan if v is None else v for v in column]

        line, = ax.plot(x_values, values(median), label=label, drawstyle="steps-post")
        ax.fill_between(x_values, values(low), values(high), color=line.get_color(), alpha=0.2, linewidth=0,
                        step="post")
    ax.set_xlim(left=0)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    ax.set_xlabel("env steps")
    ax.set_ylabel(y_label)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    if series:
        ax.legend(loc="best", fontsize="small")
    return _finish(fig, path)
