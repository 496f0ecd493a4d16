"""Ratios with confidence intervals (``harness.compare``): which interval, what it contains, which runs pair up."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.compare import (METRICS, Pair, change, comparison_table, file_pairs, independent_ratio, metric_ratio,
                             paired_ratio, variant_pairs)
from harness.errors import UserError
from results_factory import make_result

rates = st.lists(st.floats(min_value=1.0, max_value=1e6, allow_nan=False), min_size=1, max_size=9)


def _metric(key: str):  # noqa: ANN202
    return next(m for m in METRICS if m.key == key)


# --------------------------------------------------------------------------- the intervals

def test_paired_ratio_is_the_median_of_round_by_round_ratios() -> None:
    ratio = paired_ratio([100.0, 200.0, 100.0], [300.0, 400.0, 500.0])
    assert ratio.value == 3.0
    assert ratio.method == "paired" and ratio.n == 3
    assert (ratio.low, ratio.high) == (2.0, 5.0)  # with 3 rounds the 95 % bootstrap interval is their range


def test_paired_ratio_cancels_drift_that_hits_both_runs_alike() -> None:
    """The machine slows down 3x half way: every round's ratio is still 2, so the interval is tight."""
    base = [1000.0, 1000.0, 333.0, 333.0, 1000.0]
    cand = [2 * b for b in base]
    paired = paired_ratio(base, cand)
    independent = independent_ratio(base, cand)
    assert paired.low == paired.high == 2.0
    assert independent.high - independent.low > 1.0  # unpaired, the same drift looks like noise


def test_independent_ratio_is_the_ratio_of_medians() -> None:
    ratio = independent_ratio([100.0, 110.0, 90.0], [50.0, 60.0, 40.0, 55.0, 45.0])
    assert ratio.value == pytest.approx(0.5)
    assert ratio.method == "independent" and ratio.n == 3
    assert ratio.low < 0.5 < ratio.high


def test_intervals_are_deterministic_with_their_fixed_seed() -> None:
    base, cand = [100.0, 104.0, 97.0, 101.0], [90.0, 95.0, 99.0, 93.0]
    assert independent_ratio(base, cand) == independent_ratio(base, cand)
    assert paired_ratio(base, cand) == paired_ratio(base, cand)


def test_a_single_repeat_gives_a_point_without_width() -> None:
    ratio = paired_ratio([100.0], [150.0])
    assert ratio.value == ratio.low == ratio.high == 1.5


def test_a_higher_confidence_gives_an_interval_at_least_as_wide() -> None:
    base = [100.0, 103.0, 98.0, 101.0, 99.0, 104.0, 96.0]
    cand = [95.0, 99.0, 93.0, 97.0, 94.0, 100.0, 91.0]
    narrow, wide = independent_ratio(base, cand, confidence=0.6), independent_ratio(base, cand, confidence=0.99)
    assert wide.low <= narrow.low and wide.high >= narrow.high


@given(base=rates, scale=st.floats(min_value=0.01, max_value=100.0), data=st.data())
def test_interval_contains_the_estimate_and_scales_with_the_candidate(base: list[float], scale: float,
                                                                      data: st.DataObject) -> None:
    noise = data.draw(st.lists(st.floats(min_value=0.9, max_value=1.1), min_size=len(base), max_size=len(base)))
    cand = [b * scale * n for b, n in zip(base, noise)]
    for ratio in (paired_ratio(base, cand), independent_ratio(base, cand)):
        assert ratio.low <= ratio.value <= ratio.high
        assert all(math.isfinite(x) and x > 0 for x in (ratio.low, ratio.value, ratio.high))
    doubled = paired_ratio(base, [2 * c for c in cand])
    single = paired_ratio(base, cand)
    assert doubled.value == pytest.approx(2 * single.value)
    assert doubled.low == pytest.approx(2 * single.low) and doubled.high == pytest.approx(2 * single.high)


def test_change_needs_the_whole_interval_on_one_side_of_one() -> None:
    up, down, unsure = paired_ratio([1.0] * 3, [1.2, 1.3, 1.25]), paired_ratio([1.0] * 3, [0.8, 0.7, 0.75]), \
        paired_ratio([1.0] * 3, [0.9, 1.1, 1.0])
    assert change(up, True) == "better, confirmed" and change(up, False) == "worse, confirmed"
    assert change(down, True) == "worse, confirmed"
    assert change(unsure, True) == "no confirmed change"


# --------------------------------------------------------------------------- which runs are compared

def test_one_file_compares_each_variant_with_its_baseline_paired() -> None:
    runs = [make_result("baseline"), make_result("optimized"),
            make_result("baseline", preset="ppo-acrobot"), make_result("optimized", preset="ppo-acrobot")]
    pairs = variant_pairs(runs)
    assert [(p.base.variant, p.cand.variant, p.cand.preset) for p in pairs] == [
        ("baseline", "optimized", "ppo-cartpole"), ("baseline", "optimized", "ppo-acrobot")]
    assert all(p.paired for p in pairs)


def test_one_file_with_one_run_is_bad_input() -> None:
    with pytest.raises(UserError, match="nothing to compare"):
        variant_pairs([make_result("optimized")], "r.json")


def test_two_files_match_runs_by_preset_and_variant_unpaired() -> None:
    a = [make_result("baseline", [1.0]), make_result("optimized", [2.0])]
    b = [make_result("optimized", [3.0]), make_result("baseline", [4.0])]
    pairs = file_pairs(a, b)
    assert [(p.base.variant, p.cand.variant) for p in pairs] == [("optimized", "optimized"), ("baseline", "baseline")]
    assert [metric_ratio(p, _metric("env_steps_per_sec")).value for p in pairs] == [1.5, 4.0]
    assert not any(p.paired for p in pairs)


def test_two_single_run_files_are_compared_whatever_their_names() -> None:
    (pair,) = file_pairs([make_result("baseline")], [make_result("optimized", preset="ppo-acrobot")])
    assert pair.label == "ppo-acrobot/optimized vs ppo-cartpole/baseline"


def test_files_without_a_common_run_are_bad_input() -> None:
    a = [make_result("baseline"), make_result("optimized")]
    b = [make_result("baseline", preset="ppo-acrobot"), make_result("optimized", preset="ppo-acrobot")]
    with pytest.raises(UserError, match="no preset/variant in common"):
        file_pairs(a, b, "a.json", "b.json")


# --------------------------------------------------------------------------- metrics

def test_rates_get_intervals_single_values_get_plain_ratios_and_returns_none() -> None:
    pair = Pair(make_result("baseline", latency_p50=2.0), make_result("optimized", [2000.0, 2020.0, 1980.0],
                                                                       latency_p50=0.5), paired=True)
    assert metric_ratio(pair, _metric("env_steps_per_sec")).method == "paired"
    latency = metric_ratio(pair, _metric("inference_latency_ms p50"))
    assert latency.method == "single" and latency.value == 0.25
    assert metric_ratio(pair, _metric("mean_return_last_k")) is None


def test_a_run_without_measurements_has_no_rate_ratio() -> None:
    pair = Pair(make_result("baseline"), make_result("optimized", [], status="failed"), paired=False)
    assert metric_ratio(pair, _metric("env_steps_per_sec")) is None


def test_comparison_table_names_the_interval_method() -> None:
    from rich.console import Console

    console = Console(width=220, record=True)
    console.print(comparison_table(Pair(make_result("baseline", [1000.0] * 3), make_result("optimized", [2000.0] * 3),
                                        True)))
    text = " ".join(console.export_text().split())
    assert "paired (repeats interleaved in one process)" in text
    assert "2.00x [2.00-2.00]" in text and "better, confirmed" in text
