"""The learning statistics (through rliable) and the margin verdicts: what each number means, checked on data
whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.stats import intervals, learning, verdicts
from harness.stats.verdicts import INCONCLUSIVE, LESS, MORE, SAME


def test_iqm_is_the_mean_of_the_middle_half_and_ignores_one_collapsed_seed() -> None:
    scores = [10.0, 500.0, 480.0, 490.0, 470.0, 460.0, 450.0, 440.0]
    assert learning.iqm(scores) == pytest.approx(np.mean(sorted(scores)[2:6]))
    assert learning.iqm(scores) > 440.0 > np.mean(scores)  # the collapsed seed drags the mean, not the IQM


def test_identical_arms_give_a_zero_difference_with_an_interval_around_it() -> None:
    scores = [100.0, 120.0, 140.0, 110.0, 130.0, 125.0]
    diff = learning.iqm_difference(scores, list(scores))
    assert diff.value == 0.0 and diff.low < 0.0 < diff.high


def test_a_shifted_arm_has_its_shift_as_difference_and_an_interval_excluding_zero() -> None:
    a = np.array([100.0, 120.0, 140.0, 110.0, 130.0, 125.0])
    diff = learning.iqm_difference(a - 50.0, a)
    assert diff.value == pytest.approx(-50.0) and diff.high < 0.0 and diff.low <= diff.value <= diff.high


def test_the_stratified_bootstrap_is_reproducible_and_leaves_numpys_global_rng_alone() -> None:
    np.random.seed(7)
    before = np.random.get_state()[1].copy()
    first = learning.iqm_difference([1.0, 5.0, 9.0, 4.0], [2.0, 3.0, 8.0])
    assert (np.random.get_state()[1] == before).all()
    assert first == learning.iqm_difference([1.0, 5.0, 9.0, 4.0], [2.0, 3.0, 8.0])


def test_more_seeds_narrow_the_interval() -> None:
    rng = np.random.default_rng(3)
    few, many = rng.normal(100, 20, 5), rng.normal(100, 20, 40)
    assert learning.iqm_interval(many).half_width < learning.iqm_interval(few).half_width


def test_probability_of_improvement_is_a_half_for_alike_arms_and_one_for_a_dominating_one() -> None:
    a = [1.0, 2.0, 3.0, 4.0]
    assert learning.probability_of_improvement(a, a).value == 0.5
    assert learning.probability_of_improvement([10.0, 11.0, 12.0], a).value == 1.0
    assert learning.probability_of_improvement(a, [10.0, 11.0, 12.0]).value == 0.0


def test_normalise_scales_each_task_by_the_reference_iqm() -> None:
    ref = np.array([[100.0, -200.0], [100.0, -200.0], [100.0, -200.0]])
    out = learning.normalise({"ref": ref, "other": ref * 0.5}, "ref")
    assert np.allclose(out["ref"], [[1.0, -1.0]] * 3) and np.allclose(out["other"], [[0.5, -0.5]] * 3)
    with pytest.raises(ValueError, match="interquartile mean is 0"):
        learning.normalise({"ref": np.zeros((3, 1))}, "ref")


def test_performance_profile_is_the_share_of_runs_above_each_threshold() -> None:
    profile = learning.performance_profile({"a": [0.2, 0.6, 1.0, 1.4]}, [0.0, 0.5, 1.2], resamples=50)
    assert profile["a"]["share"] == [1.0, 0.75, 0.25]
    assert all(low <= share <= high for low, share, high in
               zip(profile["a"]["low"], profile["a"]["share"], profile["a"]["high"]))


@pytest.mark.parametrize("value, low, high, word", [
    (0.0, -4.0, 4.0, SAME), (-6.0, -9.0, -1.0, LESS), (6.0, 1.0, 9.0, MORE), (0.0, -12.0, 12.0, INCONCLUSIVE),
    (-3.0, -10.5, 4.0, INCONCLUSIVE), (9.0, -1.0, 11.0, INCONCLUSIVE),
])
def test_each_verdict_answers_its_question(value: float, low: float, high: float, word: str) -> None:
    assert verdicts.judge(value, low, high, 10.0, 8).word == word


def test_inconclusive_names_the_seeds_that_would_resolve_it_at_the_observed_spread() -> None:
    # half-width 12 at 8 seeds, estimate 0: a half-width under 10 needs 8 * (12 / 10)^2 = 11.5 -> 12 seeds
    assert verdicts.judge(0.0, -12.0, 12.0, 10.0, 8).seeds_needed == 12
    # an estimate beyond the margin: enough seeds that the half-width (13 here) falls under |estimate| (12)
    assert verdicts.judge(-12.0, -15.0, 1.0, 10.0, 8).seeds_needed == math.ceil(8 * (13.0 / 12.0) ** 2)
    assert "~12 seeds would resolve +-10 %" in verdicts.judge(0.0, -12.0, 12.0, 10.0, 8).text(10.0, " %")


@pytest.mark.parametrize("margin", [0, -1.0, float("nan"), float("inf"), True, "5"])
def test_a_margin_must_be_a_finite_positive_number(margin: object) -> None:
    with pytest.raises(ValueError, match="accepted: a positive number"):
        verdicts.check_margin(margin)  # type: ignore[arg-type]


def test_paired_ratio_interval_is_a_bootstrap_of_the_median_round_ratio() -> None:
    ratio = intervals.paired_ratio([100.0, 100.0, 100.0, 100.0], [90.0, 95.0, 100.0, 105.0])
    assert ratio.value == pytest.approx(0.975) and ratio.low >= 0.9 and ratio.high <= 1.05 and ratio.n == 4
    assert intervals.paired_ratio([100.0, 100.0, 100.0], [90.0, 95.0, 100.0]) == \
        intervals.paired_ratio([100.0, 100.0, 100.0], [90.0, 95.0, 100.0])
