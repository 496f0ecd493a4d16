"""``rlgauge calibrate``: the statistics on synthetic rates, the outputs, bad input, one short real run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TINY
from harness.analyses import calibrate
from harness.measurement import runner
from harness.analyses.calibrate import (ARMS, PLANTED, Cell, Count, blocks, build_report, evaluate, flagged, recommend,
                               repeats_grid, thresholds_grid, wilson)
from harness.cli import main
from harness.stats.compare import Ratio
from harness.errors import UserError
from harness.specs.presets import Preset, specs_for
from results_factory import make_result

TINY_ARGS = [arg for item in TINY if not item.startswith("run.repeats") for arg in ("--set", item)]


def synthetic(rounds: int, noise: float = 0.01, seed: int = 0) -> dict[str, list[float]]:
    """Per-round rates of the five arms: a shared drift, each arm's planted slowdown, a little noise."""
    rng = np.random.default_rng(seed)
    drift = 1000.0 * (1.0 + 0.2 * np.sin(np.arange(rounds) / 3.0))
    return {arm: list(drift * (1 - pct / 100) * rng.lognormal(0.0, noise, rounds)) for arm, pct in ARMS.items()}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- statistics

def test_wilson_interval_matches_the_textbook_values() -> None:
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)
    assert Count(1, 100).fmt() == "1/100 = 1.0 % [0.2-5.4]"


def test_trials_are_blocks_of_consecutive_rounds_and_the_rest_is_left_out() -> None:
    assert blocks(10, 3) == [slice(0, 3), slice(3, 6), slice(6, 9)]
    assert blocks(9, 9) == [slice(0, 9)]
    assert blocks(2, 3) == []


def test_flag_rule_is_the_gates_the_whole_interval_below_the_bar() -> None:
    assert flagged(Ratio(0.85, 0.80, 0.89, "paired", 3), 10)
    assert not flagged(Ratio(0.85, 0.80, 0.90, "paired", 3), 10)  # high end on the bar: not confirmed
    assert not flagged(Ratio(0.70, 0.60, 0.95, "paired", 3), 10)


def test_evaluate_counts_false_alarms_and_detections_per_repeats_and_threshold() -> None:
    cells = evaluate(synthetic(30), [3, 7], [5, 30])
    assert [(c.repeats, c.threshold, c.trials) for c in cells] == [(3, 5, 10), (3, 30, 10), (7, 5, 4), (7, 30, 4)]
    by = {(c.repeats, c.threshold): c for c in cells}
    assert all(c.false_alarms.k == 0 for c in cells)
    assert by[3, 5].detections == {10: Count(10, 10), 20: Count(10, 10), 50: Count(10, 10)}
    assert by[3, 30].detections == {10: Count(0, 10), 20: Count(0, 10), 50: Count(10, 10)}


def test_evaluate_uses_only_the_rounds_every_arm_completed() -> None:
    samples = synthetic(12)
    samples["slow50"] = samples["slow50"][:7]  # interrupted mid-way
    assert {c.trials for c in evaluate(samples, [3], [10])} == {2}


def _cell(r: int, t: float, false_alarms: int, detected20: int, n: int = 100) -> Cell:
    return Cell(r, t, Count(false_alarms, n), {10: Count(0, n), 20: Count(detected20, n), 50: Count(n, n)})


def test_recommendation_is_the_smallest_repeats_then_its_largest_qualifying_threshold() -> None:
    cells = [_cell(3, 5, 4, 100), _cell(3, 10, 2, 99), _cell(5, 5, 1, 100), _cell(5, 10, 0, 97),
             _cell(5, 15, 0, 60), _cell(7, 10, 0, 100)]
    rec = recommend(cells)
    assert rec.qualifies and rec.options == "--repeats 5 --max-slowdown 10"
    assert rec.text().startswith("recommended: --repeats 5 --max-slowdown 10 (false alarms 0/100")


def test_without_a_qualifying_setting_the_closest_is_named() -> None:
    rec = recommend([_cell(3, 5, 10, 100), _cell(3, 10, 2, 90), _cell(5, 10, 1, 80)])
    assert not rec.qualifies and rec.options == "--repeats 3 --max-slowdown 10"
    assert rec.text().startswith("no setting meets the target") and "closest: --repeats 3 --max-slowdown 10" in rec.text()
    assert recommend([]).cell is None


def test_grids_are_parsed_sorted_and_checked() -> None:
    assert repeats_grid("7, 3,5,3") == [3, 5, 7]
    assert thresholds_grid("10,2.5") == [2.5, 10.0]
    with pytest.raises(UserError, match="needs at least 3 repeats: power rule"):
        repeats_grid("2,5")
    with pytest.raises(UserError, match="not a whole number"):
        repeats_grid("3,five")
    for bad in ("0", "100", "-5", "nan"):
        with pytest.raises(UserError, match="--thresholds-grid"):
            thresholds_grid(bad)


# --------------------------------------------------------------------------- the arms and the report

def test_arms_are_the_variant_with_each_planted_slowdown_and_every_round() -> None:
    (optimized,) = specs_for("ppo-cartpole", "optimized", ["device=cpu"])
    specs = calibrate.arm_specs(optimized, rounds=900)
    assert [s.variant for s in specs] == ["A", "A2", "slow10", "slow20", "slow50"]
    assert [s.config.run.planted_slowdown_pct for s in specs] == [0, 0, 10, 20, 50]
    assert all(s.config.run.repeats == 900 for s in specs)  # beyond the cap of one run: one interleaved measurement
    plain = lambda c: c.model_dump(exclude={"run"})  # noqa: E731
    assert all(plain(s.config) == plain(optimized.config) for s in specs)


def _runs(samples: dict[str, list[float]], status: str = "ok") -> list:
    return [make_result(arm, s, status=status) for arm, s in samples.items()]


def test_report_holds_every_cell_the_measured_slowdowns_and_the_recommendation() -> None:
    report = build_report(_runs(synthetic(27)), "optimized", [3, 9], [5, 10], rounds_planned=27, interrupted=False)
    assert report is not None and report.rounds == 27
    assert report.slowdowns["slow20"].value == pytest.approx(0.8, abs=0.02)
    data = report.to_json()
    assert [(c["repeats"], c["threshold_pct"], c["trials"]) for c in data["cells"]] == [(3, 5, 9), (3, 10, 9),
                                                                                      (9, 5, 3), (9, 10, 3)]
    assert set(data["cells"][0]["detection"]) == {str(p) for p in PLANTED}
    assert data["recommendation"]["options"] == "--repeats 3 --max-slowdown 10"
    md = report.markdown()
    assert md.startswith("### Gate calibration: ppo-cartpole (optimized) on cpu")
    assert "trials = floor(rounds / r)" in md and "| slow50 | 50 % | 0.50x |" in md
    assert "recommended: --repeats 3 --max-slowdown 10" in md


def test_report_needs_a_sample_from_every_arm() -> None:
    samples = synthetic(6)
    samples["A2"] = []
    assert build_report(_runs(samples), "optimized", [3], [10], 6, interrupted=True) is None


# --------------------------------------------------------------------------- the command, its measurement faked

@pytest.fixture
def fake_runs(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``run_variants`` replaced: each spec gets synthetic rates for its rounds (``state["stop_at"]``
    rounds and interrupted, when set)."""
    state: dict[str, Any] = {"stop_at": None, "calls": []}

    def run_variants(specs: list, **_: Any) -> tuple[list, bool]:
        state["calls"].append([s.variant for s in specs])
        rounds = specs[0].config.run.repeats
        stop = state["stop_at"] if len(specs) > 1 else None
        samples = synthetic(rounds if stop is None else stop)
        runs = [make_result(s.variant, samples.get(s.variant, samples["A"])) for s in specs]
        return runs, stop is not None

    monkeypatch.setattr(runner, "run_variants", run_variants)
    return state


def test_calibrate_writes_json_markdown_and_runs_and_prints_the_gate_options(
        tmp_path: Path, fake_runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cal"
    code, stdout, err = run_cli(capsys, "calibrate", "ppo-cartpole", "--trials", "4", "--repeats-grid", "3,5",
                                "--thresholds-grid", "10", "--out", out, "--set", "device=cpu")
    assert code == 0, err
    assert fake_runs["calls"] == [["probe"], list(ARMS)]  # a probe round for the time estimate, then the arms
    assert "estimated time: about" in err and "x 20 rounds of 2,048 env steps" in err
    assert "recommended: --repeats 3 --max-slowdown 10" in stdout
    assert {p.name for p in out.iterdir()} == {"calibration.json", "calibration.md", "runs.json"}
    data = json.loads((out / "calibration.json").read_text(encoding="utf-8"))
    assert data["rounds"] == 20 and [c["trials"] for c in data["cells"]] == [6, 4]


def test_an_interrupted_calibration_writes_what_was_measured_and_exits_130(
        tmp_path: Path, fake_runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    fake_runs["stop_at"] = 7
    out = tmp_path / "cal"
    code, _, err = run_cli(capsys, "calibrate", "--trials", "4", "--repeats-grid", "3", "--out", out, "--quiet")
    assert code == 130
    assert "interrupted" in err
    data = json.loads((out / "calibration.json").read_text(encoding="utf-8"))
    assert data["interrupted"] and data["rounds"] == 7 and data["cells"][0]["trials"] == 2


@pytest.mark.parametrize("argv, needle", [
    (["--trials", "0"], "--trials 0: needs at least 1 trial"),
    (["--repeats-grid", "2,5"], "needs at least 3 repeats: power rule"),
    (["--thresholds-grid", "0,10"], "--thresholds-grid 0"),
    (["--thresholds-grid", "100"], "--thresholds-grid 100"),
    (["ppo-cartpol"], "did you mean 'ppo-cartpole'"),
    (["--set", "run.repeats=5"], "--set run.repeats"),
    (["--variant", "sideways"], "--variant"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
        argv: list[str], needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        fake_runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "calibrate", *argv)
    assert code == 2, out + err
    assert len(err.splitlines()) == 1 and needle in err and out == ""
    assert list(tmp_path.iterdir()) == [] and fake_runs["calls"] == []


# --------------------------------------------------------------------------- the planted-slowdown wrapper

def test_planted_slowdown_wrapper_sets_the_knob_in_the_named_variant_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import planted_slowdown

    monkeypatch.setattr(Preset, "variant_data", Preset.variant_data)  # undone after the test
    planted_slowdown.plant(planted_slowdown.pct_of_factor(1.25), {"optimized"})
    specs = {s.variant: s.config.run.planted_slowdown_pct for s in specs_for("ppo-cartpole", "both", [])}
    assert specs == {"baseline": 0.0, "optimized": pytest.approx(20.0)}


# --------------------------------------------------------------------------- a short real measurement

@pytest.mark.slow  # a real interleaved measurement of five arms
@pytest.mark.serial  # its verdicts need the machine: another test worker's load blurs short segments
def test_a_planted_50_percent_slowdown_is_detected_in_a_real_calibration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cal"
    # trials of 5 rounds: the interval of their median shrugs off one round a busy machine disturbed
    code, _, err = run_cli(capsys, "calibrate", "ppo-cartpole", "--trials", "4", "--repeats-grid", "5",
                           "--thresholds-grid", "10", "--steps", "512", *TINY_ARGS, "--set", "run.warmup_steps=64",
                           "--out", out, "--quiet")
    assert code == 0, err
    data = json.loads((out / "calibration.json").read_text(encoding="utf-8"))
    (cell,) = data["cells"]
    shown = json.dumps({"cell": cell, "slowdowns": data["measured_slowdowns"]})
    assert cell["trials"] == 4 and cell["detection"]["50"]["k"] >= 3, shown
    assert 0.3 < data["measured_slowdowns"]["slow50"]["median"] < 0.7, shown
