"""``rlgauge detection-matrix``: the plants apply to this tree (or fail naming themselves), a dirty tree or a folder
without history is refused, asv's comparison is read row by row, and the table says what is missing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.detection import gates, matrix
from harness.detection.plants import PLANTS, PlantDoesNotApply
from harness.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def _copy_of_the_trainers(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "reference_trainers", tmp_path / "reference_trainers",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


@pytest.mark.parametrize("name", [name for name in PLANTS if name != "aa"])
def test_every_plant_applies_to_this_tree_and_its_package_still_imports(tmp_path: Path, name: str) -> None:
    root = _copy_of_the_trainers(tmp_path)
    before = {p: p.read_text(encoding="utf-8") for p in (root / "reference_trainers").rglob("*.py")}
    PLANTS[name].apply(root)
    after = {p: p.read_text(encoding="utf-8") for p in (root / "reference_trainers").rglob("*.py")}
    assert after != before  # it changed the code
    done = subprocess.run([sys.executable, "-c", "import reference_trainers"], cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_host_sync_plant_adds_one_sync_per_selection(tmp_path: Path) -> None:
    root = _copy_of_the_trainers(tmp_path)
    PLANTS["host_sync"].apply(root)
    script = ("import sys, torch; sys.path.insert(0, sys.argv[1]); "
              "from benchmarks.cost_instrument import count_costs; from benchmarks import common; "
              "t = common.build('dqn-cartpole', 'optimized', 'cpu'); "
              "obs = common.observations('CartPole-v1', t.num_envs); t.select_actions(obs); "
              "print(count_costs(lambda: [t.select_actions(obs) for _ in range(8)] and 8, torch.device('cpu'))"
              "['host_syncs'])")
    plain = subprocess.run([sys.executable, "-c", script, str(ROOT)], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    planted = subprocess.run([sys.executable, "-c", script.replace("sys.path.insert(0, sys.argv[1])",
                                                                   "sys.path.insert(0, sys.argv[1]); "
                                                                   "sys.path.insert(0, sys.argv[2])"),
                              str(ROOT), str(root)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and planted.returncode == 0, (plain.stderr + planted.stderr)[-2000:]
    assert float(planted.stdout.split()[-1]) - float(plain.stdout.split()[-1]) == pytest.approx(1.0)


def test_a_plant_whose_code_moved_fails_naming_itself(tmp_path: Path) -> None:
    root = tmp_path
    (root / "reference_trainers").mkdir()
    (root / "reference_trainers" / "__init__.py").write_text("x = 1\n", encoding="utf-8")
    with pytest.raises(PlantDoesNotApply, match="no longer provides build_trainer"):
        PLANTS["busy_thread"].apply(root)
    with pytest.raises(PlantDoesNotApply, match="learner.py"):
        PLANTS["flag_noop"].apply(root)


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    (repo / "reference_trainers").mkdir()
    (repo / "reference_trainers" / "__init__.py").write_text("def build_trainer():\n    pass\n", encoding="utf-8")
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "base"], cwd=repo, check=True)
    return repo


def test_plant_commits_are_made_on_top_of_the_base_and_a_moved_plant_is_one_line(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    base = matrix.check_repository(repo)
    commits = matrix.plant_commits(repo, base, ["aa", "busy_thread"])
    assert set(commits) == {"aa", "busy_thread"} and len(set(commits.values())) == 2
    parent = subprocess.run(["git", "rev-parse", f"{commits['busy_thread']}~1"], cwd=repo, capture_output=True,
                            text=True).stdout.strip()
    assert parent == base
    assert matrix.plant_commits(repo, base, ["busy_thread"]) == {"busy_thread": commits["busy_thread"]}  # the same commit
    with pytest.raises(UserError, match="^plant flag_noop does not apply: reference_trainers/paths/learner.py"):
        matrix.plant_commits(repo, base, ["flag_noop"])


def test_a_dirty_tree_or_a_folder_without_history_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _repo(tmp_path)
    (repo / "reference_trainers" / "__init__.py").write_text("changed = True\n", encoding="utf-8")
    with pytest.raises(UserError, match="uncommitted changes"):
        matrix.check_repository(repo)
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.chdir(plain)
    assert main(["detection-matrix", "--runs", "1"]) == 2
    err = capsys.readouterr().err
    assert "no git history here" in err and len(err.strip().splitlines()) == 1


def test_unknown_plants_or_gates_are_refused_with_what_is_accepted(capsys: pytest.CaptureFixture) -> None:
    assert main(["detection-matrix", "--plants", "nope"]) == 2
    assert "--plants: unknown nope; accepted: aa, same_thread_10" in capsys.readouterr().err
    assert main(["detection-matrix", "--gates", "gate,nope"]) == 2
    assert "--gates: unknown nope; accepted: gate, gate-base" in capsys.readouterr().err


ASV_COMPARE = """
| Change   | Before [aaaa0000]   | After [bbbb1111]   |   Ratio | Benchmark (Parameter)                                                              |
|----------|---------------------|--------------------|---------|------------------------------------------------------------------------------------|
| +        | 1.33                | 2.33               |    1.75 | bench_counts.CostCounts.track_acting_host_syncs_per_selection('ppo-cartpole', 'optimized', 'cpu') |
|          | 2.61                | 2.62               |    1    | bench_relative.RelativeCost.track_training_cost('ppo-cartpole', 'baseline', 'cpu') |
| -        | 10                  | 5                  |    0.5  | bench_counts.CostCounts.track_aten_ops_per_env_step('dqn-cartpole', 'optimized', 'cpu') |
"""

ASV_COMPARE_FAILED = """
| Change   | Before [aaaa0000]   | After [bbbb1111]   |   Ratio | Benchmark (Parameter)                                                              |
|----------|---------------------|--------------------|---------|------------------------------------------------------------------------------------|
| !        | 2.61                | failed             |     n/a | bench_relative.RelativeCost.track_training_cost('iqn-cartpole', 'baseline', 'cpu') |
|          | 1.00                | 1.00               |    1    | bench_relative.RelativeCost.track_acting_cost('iqn-cartpole', 'baseline', 'cpu') |
"""


def test_a_benchmark_the_head_broke_is_caught_as_asv_continuous_fails_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gates, "_run", lambda command, clone, timeout=0: (0, ASV_COMPARE_FAILED, 1.0))
    verdicts = gates.asv_verdicts(Path("."), Path("asv.json"), "a" * 40, "b" * 40, 5.0)
    assert verdicts[gates.ASV_RELATIVE].outcome == gates.CAUGHT
    assert "track_training_cost('iqn-cartpole', 'baseline', 'cpu') failed on the head commit" in \
        verdicts[gates.ASV_RELATIVE].detail
    assert verdicts[gates.ASV_COUNT].outcome == gates.FAILED  # no count among the rows


def test_asv_compare_rows_are_read_with_their_mark_ratio_and_name() -> None:
    rows = gates._compare_rows(ASV_COMPARE)
    assert [(mark, ratio) for mark, ratio, _ in rows] == [("+", "1.75"), ("", "1"), ("-", "0.5")]
    assert rows[0][2].startswith("bench_counts.CostCounts.track_acting_host_syncs_per_selection(")


def _state(tmp_path: Path, cells: dict[str, str], runs: int = 2) -> matrix.State:
    state = matrix.State(tmp_path / "state.json", "f" * 40)
    state.data.update(plants=["aa", "host_sync"], gates=[gates.ASV_COUNT, gates.PLUGIN], runs=runs, busy=0)
    for key, outcome in cells.items():
        gate, plant, run = key.split("|")
        state.put(gate, plant, int(run), gates.Verdict(outcome, "", 1.0))
    return state


def test_the_table_counts_caught_k_of_n_and_names_what_is_missing(tmp_path: Path) -> None:
    state = _state(tmp_path, {f"{gates.ASV_COUNT}|host_sync|1": gates.CAUGHT, f"{gates.ASV_COUNT}|host_sync|2": gates.CAUGHT,
                              f"{gates.ASV_COUNT}|aa|1": gates.MISSED, f"{gates.PLUGIN}|aa|1": gates.NO_VERDICT})
    text = matrix.table(matrix.State(tmp_path / "state.json", "f" * 40))  # read back from the saved file
    rows = {line.split("|")[1].strip().split(":")[0]: [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| aa") or line.startswith("| host_sync")}
    assert rows["host_sync"] == ["not measured", "2/2", "missing", "2/2", "2/2"]
    assert rows["aa"] == ["not measured", "0/1 (1 missing)", "0/1 (1 no verdict, 1 missing)", "0/1", "0/1"]
    assert "Missing: 4 cells" in text and state.has(gates.ASV_COUNT, "aa", 1)


def test_a_cell_that_failed_to_run_is_measured_again(tmp_path: Path) -> None:
    state = _state(tmp_path, {f"{gates.ASV_COUNT}|aa|1": gates.FAILED})
    assert not state.has(gates.ASV_COUNT, "aa", 1)
    assert "0/0" not in matrix.table(state)


def test_the_doc_table_is_replaced_between_its_markers(tmp_path: Path) -> None:
    doc = tmp_path / "tracking.md"
    doc.write_text(f"before\n{matrix.DOC_START}\nold\n{matrix.DOC_END}\nafter\n", encoding="utf-8")
    matrix.write_doc(doc, "new table\n")
    assert doc.read_text(encoding="utf-8") == f"before\n{matrix.DOC_START}\nnew table\n{matrix.DOC_END}\nafter\n"
    (tmp_path / "other.md").write_text("no markers\n", encoding="utf-8")
    with pytest.raises(UserError, match="needs the markers"):
        matrix.write_doc(tmp_path / "other.md", "x")
    assert matrix.DOC_START in (ROOT / "docs" / "tracking.md").read_text(encoding="utf-8")


def test_an_interrupted_matrix_keeps_its_cells_and_prints_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture) -> None:
    repo = _repo(tmp_path)
    workdir = tmp_path / "work"
    monkeypatch.chdir(repo)

    def interrupted(repo_: Path, workdir_: Path, plants: list, chosen: list, runs: int, busy: int,
                    base: str = "HEAD", aa_chain: int = 0) -> matrix.State:
        state = matrix.State(workdir_ / "state.json", matrix.check_repository(repo_))
        state.data.update(plants=plants, gates=chosen, runs=runs, busy=busy)
        state.put(chosen[0], plants[0], 1, gates.Verdict(gates.MISSED, "", 1.0))
        raise KeyboardInterrupt

    workdir.mkdir()
    monkeypatch.setattr(matrix, "measure", interrupted)
    assert main(["detection-matrix", "--runs", "1", "--plants", "aa,kernel", "--gates", "asv-counts",
                 "--workdir", str(workdir)]) == 130
    out = capsys.readouterr().out
    assert "interrupted; the cells measured are kept" in out and "| aa: A/A" in out and "0/1" in out
    assert "Missing: 1 cells (asv counts|kernel|1)" in out


def test_a_base_that_is_not_a_commit_is_refused(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    with pytest.raises(UserError, match="--base nope: not a commit"):
        matrix.check_repository(repo, "nope")
    assert matrix.check_repository(repo, "HEAD") == matrix.check_repository(repo)


def test_a_failed_test_is_caught_even_when_xdist_ends_the_run_as_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    out = "FAILED tests/test_flag_effects_ppo.py::test_sync_free_logging[True-ppo] - AssertionError\n!!! stopping\n"
    monkeypatch.setattr(gates, "_run", lambda command, clone, timeout=0: (2, out, 5.0))
    verdict = gates.property_tests(Path("."))
    assert verdict.outcome == gates.CAUGHT and "test_sync_free_logging" in verdict.detail
    monkeypatch.setattr(gates, "_run", lambda command, clone, timeout=0: (2, "ERROR collecting\n", 5.0))
    assert gates.property_tests(Path(".")).outcome == gates.FAILED


def test_the_acting_plants_reach_the_training_rollout_too(tmp_path: Path) -> None:
    """host_sync, kernel and float64 wrap the trainers' one acting call: training's rollout pays them as well as
    ``select_actions()`` (a float64 plant the parity tests' sentinel can see)."""
    root = _copy_of_the_trainers(tmp_path)
    PLANTS["float64"].apply(root)
    script = ("import sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2]); "
              "from reference_trainers import build_trainer; from reference_trainers.config.schema import build_config; "
              "from reference_trainers.config.resolve import resolve_config; "
              "from harness.measurement.sentinels import Float64Sentinel; "
              "t = build_trainer(resolve_config(build_config({}, ['env.num_envs=2', 'ppo.num_steps=8', 'device=cpu']))); "
              "s = Float64Sentinel(); s.__enter__(); t.iterate(); s.__exit__(None, None, None); print(s.count)")
    done = subprocess.run([sys.executable, "-c", script, str(ROOT), str(root)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 0


def test_blind_cells_are_named_not_measured_and_ci_reads_the_other_gates(tmp_path: Path) -> None:
    state = matrix.State(tmp_path / "state.json", "f" * 40)
    state.data.update(plants=["busy_thread"], gates=[gates.ASV_RELATIVE, gates.ASV_COUNT], runs=1, busy=0)
    state.put(gates.ASV_RELATIVE, "busy_thread", 1, gates.Verdict(gates.CAUGHT, "", 1.0))
    text = matrix.table(state)
    row = next(line for line in text.splitlines() if line.startswith("| busy_thread"))
    assert [c.strip() for c in row.split("|")[3:-1]] == ["1/1", "blind (by design)", "1/1", "1/1"]
    assert "asv counts on busy_thread: the counts are of the training thread's own work" in text
    assert "Missing" not in text
    assert not matrix._unmeasured(state, gates.ASV_COUNT, "busy_thread", 1)


def test_each_load_keeps_its_own_cells_and_both_tables_are_printed(tmp_path: Path) -> None:
    base = "f" * 40
    for busy, outcome in ((0, gates.CAUGHT), (2, gates.MISSED)):
        state = matrix.State(matrix.state_path(tmp_path, busy), base)
        state.data.update(plants=["aa"], gates=[gates.ASV_COUNT], runs=1, busy=busy)
        state.put(gates.ASV_COUNT, "aa", 1, gates.Verdict(outcome, "", 1.0))
    assert matrix.state_path(tmp_path, 2).name == "state-busy2.json"
    text = matrix.tables(tmp_path, base)
    quiet, busy = text.split("Detection matrix:")[1:]
    assert "no busy loops added" in quiet and "| aa: A/A" in quiet and "1/1" in quiet
    assert "with 2 busy loops beside" in busy and "0/1" in busy


def test_the_aa_chain_compares_each_empty_commit_with_its_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _repo(tmp_path)
    base = matrix.check_repository(repo)
    commits = matrix.chain_commits(repo, base, 3)
    assert commits == matrix.chain_commits(repo, base, 3)  # the same commits in every run
    parents = [subprocess.run(["git", "rev-parse", f"{c}~1"], cwd=repo, capture_output=True, text=True).stdout.strip()
               for c in commits]
    assert parents == [base, *commits[:2]]
    compared = []
    monkeypatch.setattr(gates, "asv_run", lambda clone, config, hashes: (0, "", 9.0))

    def verdicts(clone: Path, config: Path, before: str, after: str, seconds: float) -> dict:
        compared.append((before, after))
        alarm = gates.CAUGHT if after == commits[1] else gates.MISSED
        return {gates.ASV_RELATIVE: gates.Verdict(alarm, "", seconds), gates.ASV_COUNT: gates.Verdict(gates.MISSED, "", seconds)}

    monkeypatch.setattr(gates, "asv_verdicts", verdicts)
    (repo / "asv.conf.json").write_text("{}", encoding="utf-8")
    state = matrix.State(tmp_path / "state.json", base)
    state.data.update(plants=[], gates=[gates.ASV_RELATIVE, gates.ASV_COUNT], runs=1, busy=0, aa_chain=3)
    matrix._measure_aa_chain(repo, tmp_path, state, base, 3, [gates.ASV_RELATIVE, gates.ASV_COUNT])
    assert compared == list(zip(parents, commits))
    assert "false alarms: asv relative costs 1/3, asv counts 0/3." in matrix.table(state)


def test_a_plants_cost_is_the_median_of_its_relative_costs_over_runs(tmp_path: Path) -> None:
    rows = gates._compare_rows(ASV_COMPARE.replace("bench_counts.CostCounts.track_acting_host_syncs_per_selection",
                                                   "bench_relative.RelativeCost.track_acting_cost"))
    assert gates.median_costs(rows) == {"training": 1.0, "acting": 1.75}
    state = matrix.State(tmp_path / "state.json", "f" * 40)
    state.data.update(plants=["busy_thread"], gates=[gates.ASV_RELATIVE], runs=3, busy=0)
    for run, cost in ((1, {"training": 1.3, "acting": 1.5}), (2, {"training": 1.2, "acting": 1.4}),
                      (3, {"training": 1.4, "acting": 1.6})):
        state.put(gates.ASV_RELATIVE, "busy_thread", run, gates.Verdict(gates.CAUGHT, "", 1.0, cost))
    assert matrix._cost(state, "busy_thread", 3) == "1.30x (1.20-1.40), 1.50x (1.40-1.60)"
    assert "| 1.30x (1.20-1.40), 1.50x (1.40-1.60) | 3/3 | 3/3 |" in matrix.table(state)
