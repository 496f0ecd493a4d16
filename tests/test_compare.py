"""Ratios with confidence intervals (``harness.stats.compare``): which interval, what it contains, which runs pair up."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.cli import main
from harness.stats.compare import (METRICS, Pair, change, comparison_table, describe_method, env_rate_line, file_pairs,
                                   independent_ratio, metric_ratio, paired_ratio, state_line, untrustworthy_warning,
                                   variant_pairs)
from harness.errors import UserError
from harness.analyses.matrix import PresetRow, report_markdown
from results_factory import machine_state, make_result, write_results

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


def test_change_needs_the_whole_interval_on_one_side_of_one_and_states_its_resolution() -> None:
    up, down, unsure = paired_ratio([1.0] * 3, [1.2, 1.3, 1.25]), paired_ratio([1.0] * 3, [0.8, 0.7, 0.75]), \
        paired_ratio([1.0] * 3, [0.9, 1.1, 1.0])
    assert change(up, True) == "better, confirmed (resolves +/-4.0 %)"  # 1.25x [1.20-1.30]
    assert change(up, False) == "worse, confirmed (resolves +/-4.0 %)"
    assert change(down, True).startswith("worse, confirmed (resolves +/-")
    assert change(unsure, True) == "no confirmed change (resolves +/-10.0 %)"


def test_two_repeats_give_no_verdict_however_far_apart() -> None:
    two = paired_ratio([1.0, 1.0], [2.0, 2.1])
    assert (two.n, two.low) == (2, 2.0)  # the whole "interval" lies above 1, but it is the range of two ratios
    assert change(two, True) == "no verdict: 2 repeats (needs 3)"
    assert change(independent_ratio([1.0, 1.1], [2.0, 2.1, 2.2]), True) == "no verdict: 2 repeats (needs 3)"


def test_with_two_repeats_the_bracket_is_not_called_a_confidence_interval() -> None:
    pair = Pair(make_result("baseline", [1000.0, 1010.0]), make_result("optimized", [2000.0, 2020.0]), True)
    assert "bootstrap CI" in describe_method(pair, n=3)
    described = describe_method(pair, n=2)
    assert "2 repeats: the range of the ratios, not a confidence interval" in described and "CI" not in described


# --------------------------------------------------------------------------- which runs are compared

def test_one_file_compares_each_variant_with_its_baseline_paired() -> None:
    runs = [make_result("baseline"), make_result("optimized"),
            make_result("baseline", preset="ppo-acrobot"), make_result("optimized", preset="ppo-acrobot")]
    pairs = variant_pairs(runs)
    assert [(p.base.variant, p.cand.variant, p.cand.preset) for p in pairs] == [
        ("baseline", "optimized", "ppo-cartpole"), ("baseline", "optimized", "ppo-acrobot")]
    assert all(p.paired for p in pairs)


def test_an_interleaved_file_compares_each_variant_with_its_first_the_reference() -> None:
    """``run --variant fused_adam,baseline,sync_free`` writes the reference first: every other variant is
    compared with it; runs measured one after another keep baseline as theirs."""
    runs = [make_result("fused_adam"), make_result("baseline"), make_result("sync_free")]
    assert [(p.base.variant, p.cand.variant) for p in variant_pairs(runs)] == [("fused_adam", "baseline"),
                                                                              ("fused_adam", "sync_free")]
    for run in runs:
        run.config["interleaved"] = False  # measure() blocks
    assert [(p.base.variant, p.cand.variant) for p in variant_pairs(runs)] == [("baseline", "fused_adam"),
                                                                              ("baseline", "sync_free")]


def test_a_reference_that_took_no_update_gives_no_updates_ratio_not_a_crash() -> None:
    base, cand = make_result("baseline"), make_result("fused_adam")
    base.metrics["updates_per_sec"] = {"median": 0.0, "min": 0.0, "max": 0.0, "samples": [0.0, 0.0, 0.0]}
    pair = Pair(base, cand, True)
    assert metric_ratio(pair, _metric("updates_per_sec")) is None
    assert metric_ratio(pair, _metric("env_steps_per_sec")) is not None
    base.metrics["updates_per_sec"] = None  # as the runner writes it (a result's rates are positive)
    assert metric_ratio(pair, _metric("updates_per_sec")) is None


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


def test_cpu_seconds_per_1k_env_steps_get_a_paired_interval_and_lower_is_better() -> None:
    pair = Pair(make_result("baseline", cpu_samples=[2.0, 2.1, 1.9]),
                make_result("optimized", cpu_samples=[1.0, 1.05, 0.95]), paired=True)
    metric = _metric("cpu_seconds_per_1k_env_steps")
    ratio = metric_ratio(pair, metric)
    assert metric.higher_is_better is False
    assert ratio.method == "paired" and ratio.n == 3 and ratio.value == pytest.approx(0.5)
    assert change(ratio, metric.higher_is_better).startswith("better, confirmed (resolves +/-")
    unpaired = metric_ratio(Pair(pair.base, pair.cand, paired=False), metric)
    assert unpaired.method == "independent"


def test_a_run_from_before_cpu_seconds_were_recorded_has_no_cpu_ratio() -> None:
    pair = Pair(make_result("baseline", old=True), make_result("optimized"), paired=False)
    assert metric_ratio(pair, _metric("cpu_seconds_per_1k_env_steps")) is None


def test_a_run_without_measurements_has_no_rate_ratio() -> None:
    pair = Pair(make_result("baseline"), make_result("optimized", [], status="failed"), paired=False)
    assert metric_ratio(pair, _metric("env_steps_per_sec")) is None


def test_comparison_table_names_the_interval_method() -> None:
    from rich.console import Console

    console = Console(width=220, record=True)
    console.print(comparison_table(Pair(make_result("baseline", [1000.0] * 3), make_result("optimized", [2000.0] * 3),
                                        True)))
    exported = console.export_text()
    text = " ".join(exported.split())
    assert "paired (repeats interleaved in one process)" in text
    assert "2.00x [2.00-2.00]" in text and "better, confirmed (resolves +/-0.0 %)" in text
    (cpu_row,) = [line.split("│")[1:-1] for line in exported.splitlines() if "cpu_seconds" in line]
    assert [cell.strip() for cell in cpu_row] == ["cpu_seconds_per_1k_env_steps", "1.000 [1.000-1.000]",
                                                  "0.500 [0.500-0.500]", "0.50x [0.50-0.50]",
                                                  "better, confirmed (resolves +/-0.0 %)"]


def _rendered(pair: Pair, **headers: str) -> str:
    from rich.console import Console

    console = Console(width=220, record=True)
    console.print(comparison_table(pair, **headers))
    return " ".join(console.export_text().split())


def test_a_change_is_never_confirmed_when_a_run_compared_is_not_trustworthy() -> None:
    up = paired_ratio([100.0] * 5, [125.0, 124.0, 126.0, 125.0, 125.0])
    why = "run optimized is not trustworthy (repeats disagree)"
    assert change(up, True, why) == f"better, not confirmed: {why}"
    trusted, untrusted = make_result("baseline", [1000.0] * 3), make_result("optimized", [2000.0] * 3,
                                                                           untrustworthy=["repeats disagree"])
    text = _rendered(Pair(trusted, untrusted, True))
    assert "confirmed (" not in text and "better, not confirmed: run optimized not trustworthy" in text
    assert "Not confirmed: run optimized is not trustworthy (repeats disagree)." in text
    two_files = _rendered(Pair(make_result("optimized", [1000.0] * 3, untrustworthy=["load"]),
                               make_result("optimized", [2000.0] * 3), False),
                          base_header="A: a.json (optimized)", cand_header="B: b.json (optimized)")
    assert "better, not confirmed: run A (optimized) not trustworthy" in two_files and "confirmed (" not in two_files
    line = env_rate_line(Pair(trusted, untrusted, True))
    assert line == f"ratio optimized/baseline: env_steps_per_sec 2.00x [2.00-2.00], better, not confirmed: {why}"
    assert env_rate_line(Pair(trusted, make_result("optimized", [2000.0] * 3), True)).endswith("better, confirmed "
                                                                                              "(resolves +/-0.0 %)")


# --------------------------------------------------------------------------- machine state and quality of each run

def test_state_line_shows_load_others_share_threads_env_and_quality() -> None:
    run = make_result("optimized", state=machine_state([0.05, 0.2, 0.1], load=(0.5, 1.25), intra_op=1, capped_from=2,
                                                       omp="1"))
    line = state_line("ppo-cartpole/optimized", run)
    assert line.startswith("ppo-cartpole/optimized: load avg (1 min) before -> after 0.50 -> 1.25; ")
    assert "others' CPU share median / max 10 % / 20 %" in line
    assert "threads intra / inter 1 / 1 (capped from 2)" in line and "thread env vars OMP_NUM_THREADS=1" in line
    assert line.endswith("; trustworthy") and "\n" not in line
    assert untrustworthy_warning("x", run) is None


def test_state_line_of_an_old_file_says_not_recorded() -> None:
    line = state_line("ppo-cartpole/baseline", make_result("baseline", old=True))
    assert line == "ppo-cartpole/baseline: machine state not recorded; quality not recorded"
    partial = make_result("baseline", state={"load_avg_before": [1.0, 1.0, 1.0], "load_avg_after": [2.0, 1.0, 1.0]})
    assert "before -> after 1.00 -> 2.00; others' CPU share median / max not recorded" in state_line("b", partial)


def test_an_untrustworthy_run_gets_its_reasons_and_a_warning() -> None:
    run = make_result("baseline", untrustworthy=["other processes took 62 % of the CPU", "repeats disagree"])
    assert state_line("b", run).endswith("NOT trustworthy: other processes took 62 % of the CPU; repeats disagree")
    assert untrustworthy_warning("ppo-cartpole/baseline", run) == (
        "rlgauge: warning: ppo-cartpole/baseline is not trustworthy: other processes took 62 % of the CPU; "
        "repeats disagree")


def test_compare_prints_each_runs_state_and_warns_of_untrustworthy_runs(tmp_path, capsys) -> None:  # noqa: ANN001
    a = write_results(tmp_path / "a.json", make_result("optimized", old=True))
    b = write_results(tmp_path / "b.json", make_result("optimized", untrustworthy=["other processes took 62 %"]))
    assert main(["compare", str(a), str(b)]) == 0
    out, err = capsys.readouterr()
    assert "cpu_seconds_per_1k_env_steps" in out
    lines = [line for line in out.splitlines() if line.startswith("ppo-cartpole/optimized (")]
    assert len(lines) == 2 and lines[0].startswith("ppo-cartpole/optimized (A): ") and "not recorded" in lines[0]
    assert lines[1].endswith("NOT trustworthy: other processes took 62 %")
    assert err.count("is not trustworthy") == 1
    assert "rlgauge: warning: ppo-cartpole/optimized (B) is not trustworthy: other processes took 62 %" in err


def test_matrix_report_shows_each_runs_state_and_quality_and_names_a_range_a_range() -> None:
    rows = [PresetRow("ppo-cartpole", [make_result("baseline", [100.0, 100.0], old=True),
                                       make_result("optimized", [300.0, 310.0], untrustworthy=["repeats disagree"])])]
    text = report_markdown(rows, charts=False)
    section = text[text.index("## Machine state and quality"):]
    assert "| ppo-cartpole | baseline | not recorded | not recorded | not recorded | not recorded | quality not " \
           "recorded |" in section
    assert "| ppo-cartpole | optimized | 0.50 -> 0.75 | 3 % / 4 % | 2 / 1 | none set | NOT trustworthy: repeats " \
           "disagree |" in section
    assert "with 2 repeats the bracket is the range of the per-repeat ratios" in text and "95%" not in text
