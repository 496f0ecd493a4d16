"""``rlgauge learn``: the grid, the verdicts with margins, the outputs, any trainer, several tasks, bad input, Ctrl-C."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY

import harness.cli.analysis_commands as commands
from harness.campaigns.executors import LocalExecutor
from harness.cli import main
import harness.stats.verdicts as verdicts_module
from harness.analyses.learn_verdicts import aggregate, compare, final_count, make_grid, on_grid, parse_margins
from harness.stats.verdicts import INCONCLUSIVE, LESS, MORE, SAME

TINY_SETS = [a for item in TINY for a in ("--set", item)]
SMALL = ["--seeds", "2", "--steps", "1000", *TINY_SETS, "--quiet"]
"""Two seeds of 1,000 env steps: the least CartPole with 2 envs takes (2 x its 500-step episodes)."""


def _load(out: Path) -> dict:
    return json.loads((out / "learn.json").read_text())


# --------------------------------------------------------------------------- the grid and the statistics

def test_grid_is_evenly_spaced_up_to_the_budget() -> None:
    grid = make_grid(1000)
    assert len(grid) == 50 and grid[0] == 20 and grid[-1] == 1000
    assert make_grid(10) == list(range(1, 11))  # a budget below 50 points: one point per step


def test_on_grid_is_the_last_value_at_or_before_each_point() -> None:
    points = [(32, None), (64, 10.0), (96, 20.0)]
    assert on_grid(points, [16, 32, 63, 64, 80, 96, 128]) == [None, None, None, 10.0, 10.0, 20.0, None]


def test_aggregate_is_median_and_quartiles_over_seeds_with_values() -> None:
    agg = aggregate([[None, 1.0, 2.0], [None, 3.0, None], [None, 5.0, 4.0]])
    assert agg["n"] == [0, 3, 2]
    assert agg["median"] == [None, 3.0, 3.0]
    assert agg["q25"][1] == 2.0 and agg["q75"][1] == 4.0


MARGINS = {"final_return": 10.0, "auc": 10.0}


def _compare(first: list, second: list, grid: int, margins: dict | None = None) -> list[dict]:
    return compare("a", "b", {"task": (first, second)}, grid, margins or MARGINS)


def test_compare_counts_only_points_where_every_curve_has_a_value() -> None:
    first = [[None, 10.0, 20.0, 30.0], [None, None, 22.0, 32.0]]
    second = [[5.0, 10.0, 20.0, 30.0], [5.0, 12.0, 22.0, 32.0]]
    final, auc = _compare(first, second, 4)
    assert final_count(4) == 1 and final["grid_points"] == 1 and final["difference"] == pytest.approx(0.0)
    assert auc["grid_points"] == 2 and auc["difference"] == pytest.approx(0.0)  # not the first two: a curve lacks them
    short = _compare(first[:1], second, 4)
    assert all(row["verdict"].startswith("no verdict") and "low" not in row for row in short)


def test_a_verdict_needs_three_seeds_per_arm() -> None:
    behind = [[10.0, 20.0], [11.0, 21.0], [12.0, 22.0]]
    ahead = [[60.0, 70.0], [61.0, 71.0], [62.0, 72.0]]
    assert [row["verdict"] for row in _compare(behind, ahead, 2)] == [LESS, LESS]
    two = _compare(behind[:2], ahead, 2)
    assert [row["verdict"] for row in two] == ["no verdict: 2 seeds (needs 3)"] * 2 and two[0]["high"] < 0


def _seeds(centre: float, spread: float, n: int = 8) -> list[list[float]]:
    return [[centre + spread * (i - (n - 1) / 2) / n] * 2 for i in range(n)]


def test_same_learning_needs_the_whole_interval_inside_the_margin() -> None:
    tight, wide = _seeds(400.0, 8.0), _seeds(400.0, 400.0)
    same = _compare(tight, tight, 2)
    assert [row["verdict"] for row in same] == [SAME, SAME]
    assert same[0]["verdict_text"] == "same learning (within +-10 %)" and -10 < same[0]["low_pct"] <= 0
    unsure = _compare(wide, tight, 2)
    assert [row["verdict"] for row in unsure] == [INCONCLUSIVE] * 2  # an interval holding 0 is not "same"
    assert unsure[0]["seeds_needed"] > 8 and f"~{unsure[0]['seeds_needed']} seeds" in unsure[0]["verdict_text"]
    assert [row["verdict"] for row in _compare(wide, tight, 2, {"final_return": 200.0, "auc": 200.0})] == [SAME] * 2


def test_a_clear_lead_learns_more_and_a_shortfall_beyond_the_margin_learns_less() -> None:
    low, high = _seeds(300.0, 8.0), _seeds(400.0, 8.0)
    assert [row["verdict"] for row in _compare(high, low, 2)] == [MORE, MORE]
    rows = _compare(low, high, 2)
    assert [row["verdict"] for row in rows] == [LESS, LESS]
    assert rows[0]["difference_pct"] == pytest.approx(-25.0) and rows[0]["difference"] == pytest.approx(-100.0)
    assert rows[0]["probability_of_improvement"]["value"] == 0.0


def test_several_tasks_are_pooled_on_normalised_scores() -> None:
    # task b's returns are 100x task a's: normalised, each arm's shortfall is 10 % of the reference on both
    a_first, a_second = _seeds(90.0, 1.0), _seeds(100.0, 1.0)
    b_first, b_second = _seeds(9000.0, 100.0), _seeds(10000.0, 100.0)
    rows = compare("x", "y", {"a": (a_first, a_second), "b": (b_first, b_second)}, 2, MARGINS)
    pooled = [row for row in rows if row["task"] == "all tasks"]
    assert [row["metric"] for row in pooled] == ["final_return", "auc"]
    assert pooled[0]["difference_pct"] == pytest.approx(-10.0, abs=0.5) and pooled[0]["verdict"] == LESS
    assert "iqm_first" not in pooled[0]  # pooled scores have no common unit


@pytest.mark.parametrize("text, expected", [
    (None, MARGINS), ("5", {"final_return": 5.0, "auc": 5.0}), ("auc=2.5", {"final_return": 10.0, "auc": 2.5}),
    ("final_return=7%,auc=3", {"final_return": 7.0, "auc": 3.0}),
])
def test_margins_parse_per_metric_over_the_defaults(text: str | None, expected: dict,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.analyses.learn_verdicts as lv

    monkeypatch.setattr(lv, "DEFAULT_MARGIN_PCT", dict(MARGINS))
    assert parse_margins(text) == expected


# --------------------------------------------------------------------------- the command

def test_a_learns_less_verdict_exits_1_and_names_other_seeds_to_check_it_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verdicts_module, "judge", lambda *a: verdicts_module.Verdict(LESS))
    code = main(["learn", "ppo-cartpole", "--seeds", "3", "--steps", "1000", *TINY_SETS, "--quiet",
                 "--out", str(tmp_path / "learn")])
    err = capsys.readouterr().err
    assert code == 1
    assert ("learns less: optimized vs baseline (final return, ppo-cartpole): learns less; optimized vs baseline "
            "(area under curve, ppo-cartpole): learns less") in err
    assert "check it on other seeds: --seed 4 --seeds 3" in err


def test_learn_writes_curves_aggregates_verdicts_and_a_chart(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "learn"
    code = main(["learn", "ppo-cartpole", *SMALL, "--out", str(out)])
    data = _load(out)
    assert code == 0
    assert (out / "learn.png").read_bytes()[:4] == b"\x89PNG"
    assert data["interrupted"] is False and data["settings"]["seeds"] == [1, 2]
    assert [a["name"] for a in data["arms"]] == ["baseline", "optimized"]
    assert all(a["wall_s"] > 0 and a["kind"] == "ours" for a in data["arms"])
    grid = data["grid"]
    assert grid[-1] == 1000 and data["settings"]["min_steps"] == 1000
    for arm in ("baseline", "optimized"):
        seeds = data["curves"]["ppo-cartpole"][arm]
        assert [c["seed"] for c in seeds] == [1, 2] and all(c["complete"] and c["env_steps"] >= 1000 for c in seeds)
        assert all(len(c["on_grid"]) == len(grid) and c["on_grid"][-1] is not None for c in seeds)
        assert set(data["aggregates"]["ppo-cartpole"][arm]) == {"median", "q25", "q75", "n"}
        assert data["aggregates"]["ppo-cartpole"][arm]["n"][-1] == 2
    assert [(v["first"], v["second"], v["metric"]) for v in data["verdicts"]] == [
        ("optimized", "baseline", "final_return"), ("optimized", "baseline", "auc")]
    assert all(v["low"] <= v["difference"] <= v["high"] for v in data["verdicts"])
    assert all(v["verdict"] == "no verdict: 2 seeds (needs 3)" for v in data["verdicts"])  # an interval, no verdict
    markdown = (out / "learn.md").read_text()
    assert "| optimized vs baseline | ppo-cartpole | final return |" in markdown and "95 % CI" in markdown
    assert data["settings"]["margins_pct"] == parse_margins(None) and SAME in data["settings"]["questions"]
    captured = capsys.readouterr()
    assert markdown in captured.out and "learn with --seeds 3 or more" in captured.err


def test_peer_arm_is_trained_and_compared(tmp_path: Path) -> None:
    pytest.importorskip("stable_baselines3")
    out = tmp_path / "learn"
    main(["learn", "ppo-cartpole-sb3", "--peer", "sb3", *SMALL, "--set", "optimizations.compile_train_step=false",
          "--out", str(out)])
    data = _load(out)
    assert [(a["name"], a["kind"]) for a in data["arms"]] == [("baseline", "ours"), ("optimized", "ours"),
                                                              ("sb3", "peer")]
    assert data["arms"][2]["config"]["trainer"] == "harness.specs.peers.sb3:make_trainer"
    assert all(c["complete"] for c in data["curves"]["ppo-cartpole-sb3"]["sb3"])
    assert [(v["first"], v["second"]) for v in data["verdicts"][::2]] == [
        ("optimized", "sb3"), ("baseline", "sb3"), ("optimized", "baseline")]


def _without_sb3(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.specs import peers

    real_import = peers.importlib.import_module

    def without_sb3(name: str):
        if name == "stable_baselines3":
            raise ImportError(name)
        return real_import(name)

    monkeypatch.setattr(peers.importlib, "import_module", without_sb3)


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "1"], "--seeds 1: learn needs at least 2 seeds"),
    (["--seeds", "2", "--steps", "600"], "--steps 600: too short for learn: CartPole-v1 episodes last up to 500"),
    (["--peer", "nope"], "--peer 'nope': unknown peer; accepted: sb3"),
    (["--peer", "sb3", "no-sb3"], "install it with pip install 'rlgauge[peers]'"),
    (["--cpus-per-job", "0"], "--cpus-per-job 0: accepted: a whole number of CPUs, 1 or more"),
    (["--executor", "dask"], "--executor dask: unknown executor; accepted: local | ray | ray:ADDRESS"),
    (["--config", "x.yaml"], "--config: only used with --trainer"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                            message: str) -> None:
    if "no-sb3" in argv:
        argv.remove("no-sb3")
        _without_sb3(monkeypatch)
    out = tmp_path / "learn"
    code = main(["learn", "ppo-cartpole", *TINY_SETS, *argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("rlgauge: error: ") and not out.exists()


def test_ctrl_c_writes_what_was_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from reference_trainers.ppo.trainer import PPOTrainer

    real_iterate, calls = PPOTrainer.iterate, []

    def iterate(self: PPOTrainer):
        calls.append(1)
        if len(calls) == 7:
            raise KeyboardInterrupt
        return real_iterate(self)

    monkeypatch.setattr(PPOTrainer, "iterate", iterate)
    # the patched iterate lives in this process: the jobs run here (tests/test_campaigns.py stops fresh ones)
    monkeypatch.setattr(commands, "parse_executor", lambda text, **_options: LocalExecutor())
    out = tmp_path / "learn"
    assert main(["learn", "ppo-cartpole", *SMALL, "--out", str(out)]) == 130
    data = _load(out)
    assert data["interrupted"] is True
    recorded = [c for arm in data["curves"]["ppo-cartpole"].values() for c in arm]
    assert sum(len(c["points"]) for c in recorded) == 6 and not any(c["complete"] for c in recorded)
    assert all(v["verdict"].startswith("no verdict") for v in data["verdicts"])
    assert "(interrupted)" in (out / "learn.md").read_text() and (out / "learn.png").exists()
    assert "interrupted" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.machine_load  # fair threads see the real load: threads spinning against a neighbour take many times longer
def test_both_variants_learn_alike(tmp_path: Path) -> None:
    """Learning parity of ppo-cartpole-sb3's variants: 3 seeds of 30,000 env steps each."""
    out = tmp_path / "learn"
    main(["learn", "ppo-cartpole-sb3", "--seeds", "3", "--steps", "30000", "--device", "cpu", "--quiet",
          "--out", str(out)])
    verdicts = [v for v in _load(out)["verdicts"] if (v["first"], v["second"]) == ("optimized", "baseline")]
    assert len(verdicts) == 2 and not any(v["verdict"] == LESS for v in verdicts), verdicts


def test_learn_resolves_budget_aware_flags_against_its_step_budget() -> None:
    from harness.analyses.learn import plan_learning

    def compiles(steps: int, *extra: str) -> bool:
        plan = plan_learning("ppo-cartpole-sb3", ["device=cpu", "tuning.compile_break_even_env_steps=30000", *extra],
                             peer=None, seeds=2, steps=steps)
        optimized = next(arm for arm in plan.arms if arm.name == "optimized")
        return all(r.config.optimizations.compile_train_step for r in optimized.resolutions)

    # with the torch hand-written step, the budget decides; numpy_update (auto: on) never compiles
    assert (compiles(29_999, "optimizations.numpy_update=false"), compiles(30_000, "optimizations.numpy_update=false")
            ) == (False, True)
    assert not compiles(30_000)


# --------------------------------------------------------------------------- any trainer, margins, strict, --from

EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "examples" / "cleanrl_ppo"


def _example_config(tmp_path: Path) -> Path:
    config = tmp_path / "bench.yaml"
    config.write_text("config: {num_envs: 2, num_steps: 16, num_minibatches: 2, update_epochs: 1}\n"
                      "variants:\n  baseline: {}\n  optimized: {batched_inference_no_grad: true, fused_adam: true}\n")
    return config


def test_learn_takes_a_users_trainer_and_reads_its_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE_DIR))
    out = tmp_path / "learn"
    code = main(["learn", "--trainer", "ppo_cartpole:make_trainer", "--config", str(_example_config(tmp_path)),
                 "--seeds", "3", "--steps", "600", "--quiet", "--out", str(out)])
    data = _load(out)
    assert code in (0, 1) and data["tasks"] == ["bench"] and data["settings"]["reference"] == "baseline"
    curves = data["curves"]["bench"]
    assert set(curves) == {"baseline", "optimized"}
    assert all(c["complete"] and any(r is not None for _, r in c["points"]) for arm in curves.values() for c in arm)
    assert [(v["first"], v["second"]) for v in data["verdicts"]] == [("optimized", "baseline")] * 2
    assert all(v["verdict"] in (SAME, LESS, MORE, INCONCLUSIVE) for v in data["verdicts"])


def test_a_users_trainer_without_returns_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "no_returns.py").write_text(
        "class T:\n    def iterate(self):\n        return 4\n    def close(self):\n        pass\n\n"
        "def make_trainer(config, *, device, seed):\n    return T()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "t.yaml"
    config.write_text("variants: {baseline: {}, optimized: {}}\n")
    code = main(["learn", "--trainer", "no_returns:make_trainer", "--config", str(config), "--seeds", "3",
                 "--steps", "8", "--quiet", "--out", str(tmp_path / "learn")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "has no mean_recent_return()" in err, err


@pytest.mark.parametrize("margin, message", [
    ("-5", "--margin -5: '-5' is not a positive number"), ("abc", "--margin abc: 'abc' is not a positive number"),
    ("nan", "'nan' is not a positive number"), ("reward=3", "'reward' is not a metric"),
])
def test_a_bad_margin_is_exit_2_naming_what_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        margin: str, message: str) -> None:
    code = main(["learn", "ppo-cartpole", *SMALL, "--margin", margin, "--out", str(tmp_path / "learn")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "accepted: a positive percentage" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "learn").exists()


def _recorded(tmp_path: Path, first: float, spread: float) -> Path:
    """A learn.json of 4 seeds whose optimized arm's returns sit at ``first`` around a baseline at 100."""
    grid = [500, 1000]
    curve = lambda seed, value: {"seed": seed, "complete": True, "env_steps": 1000, "wall_s": 1.0, "build_s": 0.0,  # noqa: E731
                                 "error": None, "on_grid": [value, value], "points": [[500, value], [1000, value]]}
    offsets = [spread * (i - 1.5) for i in range(4)]
    data = {"preset": "p", "interrupted": False, "grid": grid,
            "settings": {"steps": 1000, "seeds": [1, 2, 3, 4], "peer": None, "grid_points": 2, "final_fraction": 0.1,
                         "confidence": 0.95, "resamples": 2000, "device": "cpu", "return_window": 20},
            "arms": [{"name": "baseline", "kind": "ours", "wall_s": 1.0, "env_steps_per_sec": 1.0},
                     {"name": "optimized", "kind": "ours", "wall_s": 1.0, "env_steps_per_sec": 1.0}],
            "curves": {"baseline": [curve(i + 1, 100.0 + o) for i, o in enumerate(offsets)],
                       "optimized": [curve(i + 1, first + o) for i, o in enumerate(offsets)]}}
    path = tmp_path / "learn.json"
    path.write_text(json.dumps(data))
    return path


def test_from_judges_a_recorded_campaign_again_and_strict_fails_an_inconclusive_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recorded = str(_recorded(tmp_path, 100.0, 20.0))  # alike, but spread wide: inside +-50 %, not inside +-5 %
    assert main(["learn", "--from", recorded, "--margin", "50"]) == 0
    assert "same learning (within +-50 %)" in capsys.readouterr().out
    assert main(["learn", "--from", recorded, "--margin", "5"]) == 0  # inconclusive is not a failure...
    assert "inconclusive (~" in capsys.readouterr().out
    assert main(["learn", "--from", recorded, "--margin", "5", "--strict"]) == 1  # ...unless --strict
    assert "not shown alike: optimized vs baseline (final return, p): inconclusive" in capsys.readouterr().err
    assert main(["learn", "--from", str(_recorded(tmp_path, 50.0, 2.0))]) == 1  # half the return: learns less


@pytest.mark.parametrize("content, message", [(None, "no such file"), ("{", "not a readable JSON file"),
                                              ("{}", "not a learn.json (needs preset")])
def test_from_a_missing_or_corrupt_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  content: str | None, message: str) -> None:
    path = tmp_path / "learn.json"
    if content is not None:
        path.write_text(content)
    assert main(["learn", "--from", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
