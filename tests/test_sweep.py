"""``rlgauge sweep``: parsing ``--param``, the grid of points, the table and the outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TINY
from harness.cli import main
from harness.errors import UserError
from harness.analyses.sweep import Param, markdown_table, parse_param, points, series, split_values, sweep_specs
from reference_trainers.config.resolve import resolve_config
from results_factory import make_result

TINY_SETS = [a for item in TINY for a in ("--set", item)]



def test_values_split_on_commas_outside_brackets() -> None:
    assert split_values("1, 2,4") == ["1", "2", "4"]
    assert split_values("[64,64],[128, 128]") == ["[64,64]", "[128, 128]"]


def test_param_values_are_parsed_like_set() -> None:
    assert parse_param("env.num_envs=4,16") == Param("env.num_envs", ("4", "16"))
    specs = sweep_specs("ppo-cartpole", "optimized", [parse_param("model.hidden_sizes=[32,32],[8]")], ["device=cpu"])
    assert [s.config.model.hidden_sizes for s in specs] == [[32, 32], [8]]
    assert [s.variant for s in specs] == ["model.hidden_sizes=[32,32]", "model.hidden_sizes=[8]"]


def test_two_params_make_a_grid_in_order_first_param_slowest() -> None:
    params = [parse_param("env.num_envs=2,4"), parse_param("env.vectorization=serial,sync")]
    specs = sweep_specs("ppo-cartpole", "baseline", params, ["device=cpu"])
    assert [(s.config.env.num_envs, resolve_config(s.config).config.env.vectorization) for s in specs] == [
        (2, "serial"), (2, "sync"), (4, "serial"), (4, "sync")]
    assert all(not s.config.optimizations.batch_inference for s in specs)  # the baseline variant's flags


@pytest.mark.parametrize("text", ["env.num_envs", "=1,2", "env.num_envs=", "env.num_envs=1,,2", "env.num_envs=2,2"])
def test_malformed_param_is_a_user_error(text: str) -> None:
    with pytest.raises(UserError, match="--param"):
        parse_param(text)


GRID = [Param("env.num_envs", ("2", "4")), Param("env.vectorization", ("serial", "sync"))]


def test_pivot_marks_the_fastest_value_per_row_with_its_lead_and_resolution() -> None:
    runs = [make_result("a", [100.0, 100.0, 100.0]), make_result("b", [200.0, 220.0, 210.0]),
            make_result("c", [300.0, 300.0, 300.0]), make_result("d", [150.0, 150.0, 150.0])]
    pts = points(GRID, runs)
    assert pts[1].vs_first.value == pytest.approx(2.1)
    table = markdown_table("t", GRID, pts)
    assert "| 2 | 100 | **210** | 2.10x [2.00-2.20] faster (resolves +/-4.8 %) |" in table
    assert "| 4 | **300** | 150 | 2.00x [2.00-2.00] faster (resolves +/-0.0 %) |" in table
    assert series(GRID, pts)["env.vectorization=sync"][1] == (150.0, 150.0, 150.0)


def test_pivot_names_no_fastest_value_from_two_repeats() -> None:
    runs = [make_result("a", [100.0, 100.0]), make_result("b", [200.0, 220.0]),
            make_result("c", [300.0, 300.0]), make_result("d", [150.0, 150.0])]
    table = markdown_table("t", GRID, points(GRID, runs))
    assert "| 2 | 100 | 210 | no verdict: 2 repeats (needs 3) |" in table and "**" not in table


def test_pivot_says_within_noise_when_the_two_fastest_overlap() -> None:
    runs = [make_result("a", [100.0, 104.0, 96.0]), make_result("b", [101.0, 97.0, 103.0]),
            make_result("c", [300.0, 300.0, 300.0]), make_result("d", [150.0, 150.0, 150.0])]
    table = markdown_table("t", GRID, points(GRID, runs))
    row = [line for line in table.splitlines() if line.startswith("| 2 |")][-1]  # the pivot, after the points
    assert "within noise (resolves +/-" in row and "**" not in row


@pytest.mark.parametrize("argv, message", [
    ([], "sweep needs --param"),
    (["--param", "env.num_envs=0,2"], "env.num_envs: invalid value 0"),
    (["--param", "env.vectorization=serial,warp"], "env.vectorization"),
    (["--param", "env.bogus=1,2"], "env.bogus: unknown key"),
    (["--param", "seed=1,2", "--param", "seed=3"], "swept twice"),
    (["--param", "seed=1", "--param", "env.num_envs=2", "--param", "run.steps=8"], "at most 2"),
])
def test_sweep_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                               argv: list[str], message: str) -> None:
    code = main(["sweep", "ppo-cartpole", "--device", "cpu", "--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_sweep_tiny_run_writes_table_json_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "sw"
    code = main(["sweep", "ppo-cartpole", *TINY_SETS, "--repeats", "2", "--param", "ppo.num_steps=8,16",
                 "--out", str(out), "--quiet"])
    stdout = capsys.readouterr().out
    assert code == 0
    assert "| ppo.num_steps | env_steps_per_sec" in stdout and "| 16 |" in stdout
    data = json.loads((out / "sweep.json").read_text(encoding="utf-8"))
    assert [p["values"] for p in data["points"]] == [{"ppo.num_steps": "8"}, {"ppo.num_steps": "16"}]
    assert all(len(p["env_steps_per_sec"]["samples"]) == 2 for p in data["points"])
    assert data["points"][0]["vs_first"]["median"] == 1.0
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"


# --------------------------------------------------------------------------- the size limit (sweep and matrix)

def _fake_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``run_variants`` that measures nothing: each spec gets a made-up result; returns the batch sizes."""
    from harness.measurement import runner

    calls: list[int] = []

    def run_variants(specs: list, **_kwargs: object) -> tuple[list, bool]:
        calls.append(len(specs))
        return [make_result(spec.variant, [1000.0 + i, 1010.0 + i, 990.0 + i], preset=spec.preset)
                for i, spec in enumerate(specs)], False

    monkeypatch.setattr(runner, "run_variants", run_variants)
    return calls


def test_size_text_gives_runs_env_steps_and_a_time_estimate() -> None:
    from harness.specs.run_size import Size, duration

    assert Size(10_050, 10_050 * 26_624, exact=False).text() == (
        "10,050 runs of about 26,624 env steps each (267,571,200 in all, warm-up included): about 3.1 days "
        "at 1,000 env steps/s")
    assert [duration(s) for s in (0.2, 89, 600, 7200, 3 * 86400)] == ["1 s", "89 s", "10 min", "2.0 h", "3.0 days"]
    assert not Size(50, 20_000_000).over_limit and Size(51, 1).over_limit and Size(1, 20_000_001).over_limit


def test_sweep_above_the_limit_is_refused_before_anything_is_built(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    calls = _fake_runs(monkeypatch)
    seeds = ",".join(str(i) for i in range(201))
    code = main(["sweep", "ppo-cartpole", "--device", "cpu", "--param", f"seed={seeds}", "--param",
                 "env.num_envs=" + ",".join(str(i) for i in range(1, 51)), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and calls == [] and not (tmp_path / "o").exists()
    assert err == ("rlgauge: error: sweep: 10,050 runs of about 26,624 env steps each (267,571,200 in all, warm-up "
                   "included): about 3.1 days at 1,000 env steps/s; that is more than the 50 runs it takes without "
                   "--yes: pass --yes to run it, or measure less (fewer --param values, --steps or --repeats)\n")


def test_sweep_above_the_limit_runs_with_yes_and_says_its_size(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    from harness.cli import analysis_commands as cli_analysis
    from harness.specs import run_size

    monkeypatch.setattr(run_size, "MAX_RUNS", 3)  # a small grid above a small limit: fast
    monkeypatch.setattr(cli_analysis, "MAX_RUNS", 3)
    calls = _fake_runs(monkeypatch)
    argv = ["sweep", "ppo-cartpole", "--device", "cpu", "--param", "seed=1,2,3,4", "--out", str(tmp_path / "o")]
    assert main(argv) == 2 and calls == []
    assert "more than the 3 runs" in capsys.readouterr().err
    assert main([*argv, "--yes"]) == 0 and calls == [4]
    err = capsys.readouterr().err
    assert "sweep: 4 runs of 26,624 env steps each (106,496 in all, warm-up included): about 2 min at 1,000 env " \
           "steps/s (--yes given)" in err
    assert json.loads((tmp_path / "o" / "sweep.json").read_text(encoding="utf-8"))["points"][3]["values"] == {"seed": "4"}


def test_sweep_below_the_limit_says_nothing_of_its_size(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    calls = _fake_runs(monkeypatch)
    assert main(["sweep", "ppo-cartpole", "--device", "cpu", "--param", "seed=1,2", "--out", str(tmp_path / "o")]) == 0
    assert calls == [2] and "env steps each" not in capsys.readouterr().err


def test_matrix_above_the_limit_runs_with_yes(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    from harness.analyses import matrix
    from harness.measurement import runner

    calls = _fake_runs(monkeypatch)
    monkeypatch.setattr(matrix, "run_variants", runner.run_variants)  # matrix imported it by name
    argv = ["matrix", "--presets", "ppo-cartpole", "--device", "cpu", "--steps", str(10**7), "--out",
            str(tmp_path / "m")]
    assert main(argv) == 2 and calls == [] and not (tmp_path / "m").exists()
    assert main([*argv, "--yes"]) == 0 and calls == [2]
    assert "matrix: 2 runs of 30,002,048 env steps each" in capsys.readouterr().err
    assert (tmp_path / "m" / "report.html").is_file()
