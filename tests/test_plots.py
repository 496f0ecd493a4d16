"""The charts cannot mislead: ratios on a log axis from 1.0x, slowdowns coloured apart from speedups,
throughput of categories as grouped bars, and every throughput axis from 0 (synthetic data only)."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.figure import Figure

from harness.report import plots
from harness.stats.compare import Ratio

FAST = Ratio(2.0, 1.8, 2.2, "paired", 5)
SLOW = Ratio(0.5, 0.45, 0.55, "paired", 5)
UNSURE = Ratio(1.02, 0.95, 1.1, "paired", 5)
THIN = Ratio(1.5, 1.4, 1.6, "paired", 2)  # two repeats: no verdict
THROUGHPUT = {"baseline": [(1000.0, 950.0, 1040.0), (5000.0, 4900.0, 5100.0), None],
              "optimized": [(2100.0, 2000.0, 2200.0), (5200.0, 5000.0, 5300.0), (800.0, 780.0, 820.0)]}


def _axes(fig: Figure) -> Axes:
    assert isinstance(fig, Figure)
    return fig.axes[0]


def _png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def _bars(ax: Axes) -> list:
    return [patch for c in ax.containers if isinstance(c, BarContainer) for patch in c.patches]


def _color(patch) -> str:  # a matplotlib Rectangle
    return to_hex(patch.get_facecolor())


def test_speedup_bar_chart_is_log_from_one_with_direction_colours(tmp_path: Path) -> None:
    path = tmp_path / "speedup.png"
    ax = _axes(plots.bar_chart(path, "t", ["fast", "slow", "unsure", "thin", "missing"],
                               [FAST, SLOW, UNSURE, THIN, None], "speedup"))
    _png(path)
    assert ax.get_xscale() == "log"
    low, high = ax.get_xlim()
    assert low < 0.5 and high > 2.0 and low * high == pytest.approx(1.0)  # symmetric about 1x
    assert any(list(line.get_xdata()) == [1.0, 1.0] for line in ax.get_lines())  # the 1.0x reference
    fast, slow, unsure, thin = _bars(ax)
    assert _color(fast) == plots.SPEEDUP_COLOR and _color(slow) == plots.SLOWDOWN_COLOR
    assert _color(fast) != _color(slow)
    assert _color(unsure) == _color(thin) == plots.NEUTRAL_COLOR
    # bars start at 1.0x: a slowdown points left, a speedup right, equally long in log terms
    assert fast.get_x() == pytest.approx(1.0) and fast.get_x() + fast.get_width() == pytest.approx(2.0)
    assert slow.get_x() == pytest.approx(1.0) and slow.get_x() + slow.get_width() == pytest.approx(0.5)
    errorbars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(errorbars) == 4  # one interval per ratio that has one


def test_ablation_chart_is_log_with_both_arms_coloured_by_direction(tmp_path: Path) -> None:
    path = tmp_path / "ablation.png"
    ax = _axes(plots.ablation_chart(path, "t", ["a", "b"], [FAST, SLOW], [SLOW, None]))
    _png(path)
    assert ax.get_xscale() == "log"
    colours = [_color(bar) for bar in _bars(ax)]
    assert colours == [plots.SPEEDUP_COLOR, plots.SLOWDOWN_COLOR, plots.SLOWDOWN_COLOR]
    hatches = [bar.get_hatch() for bar in _bars(ax)]
    assert hatches == [None, None, "//"]  # alone solid, in-stack hatched
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]


def test_a_ratio_without_interval_is_coloured_by_its_value() -> None:
    assert plots.ratio_color(Ratio(0.8, 0.8, 0.8, "single", 1)) == plots.SLOWDOWN_COLOR
    assert plots.ratio_color(Ratio(1.0, 1.0, 1.0, "single", 1)) == plots.NEUTRAL_COLOR


def test_matrix_throughput_is_grouped_bars_from_zero(tmp_path: Path) -> None:
    path = tmp_path / "throughput.png"
    ax = _axes(plots.grouped_bar_chart(path, "t", "preset", ["a", "b", "c"], THROUGHPUT))
    _png(path)
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert len(bars) == 2 and all(len(c.patches) == 3 for c in bars)  # one bar per variant in each group
    assert not [line for line in ax.get_lines() if line.get_linestyle() not in ("None", "none", "")]
    assert ax.get_ylim()[0] == 0
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]


def test_sweep_over_numbers_is_a_sorted_line_from_zero(tmp_path: Path) -> None:
    path = tmp_path / "sweep.png"
    series = {"env_steps_per_sec": [(4000.0, 3900.0, 4100.0), (1000.0, 990.0, 1010.0), (2000.0, 1900.0, 2100.0)]}
    ax = _axes(plots.sweep_chart(path, "t", "env.num_envs", ["64", "4", "16"], series))
    _png(path)
    assert ax.get_ylim()[0] == 0
    assert ax.get_xscale() == "log"  # 4 .. 64 spans 16x
    (line,) = [line for line in ax.get_lines() if line.get_linestyle() not in ("None", "none", "")]
    assert list(line.get_xdata()) == [4.0, 16.0, 64.0] and list(line.get_ydata()) == [1000.0, 2000.0, 4000.0]


@pytest.mark.parametrize("values", [["true", "false"], ["[64,64]", "[128,128]"], ["1", "1.0"]])
def test_sweep_over_non_numeric_values_is_grouped_bars(tmp_path: Path, values: list[str]) -> None:
    path = tmp_path / "sweep.png"
    series = {"x=1": [(10.0, 9.0, 11.0), (12.0, 11.0, 13.0)], "x=2": [None, (8.0, 7.0, 9.0)]}
    ax = _axes(plots.sweep_chart(path, "t", "key", values, series))
    _png(path)
    assert sum(isinstance(c, BarContainer) for c in ax.containers) == 2
    assert ax.get_ylim()[0] == 0
