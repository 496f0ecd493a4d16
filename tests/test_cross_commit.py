"""``rlgauge gate --base REF`` (``harness.analyses.cross_commit``): the round order, the verdict on synthetic
rates, bad input, and the worktree's life, through a tiny git repository whose fake ``harness``
writes result files instantly (no real measurement); one real run of ``gate --base HEAD`` is ``slow``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from harness.analyses import cross_commit as cc
from harness.cli import build_parser, main
from harness.analyses.gate import Thresholds
from harness.results import RunResult
from results_factory import make_result

REPO_ROOT = Path(__file__).resolve().parent.parent
TH = Thresholds(max_slowdown_pct=10.0, confidence=0.95)


def _git(repo: Path, *argv: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


def _worktrees(repo: Path) -> list[str]:
    return [line for line in _git(repo, "worktree", "list", "--porcelain").splitlines() if line.startswith("worktree ")]


def _without_quality(run: RunResult) -> dict[str, Any]:
    """A run as an older harness wrote it: no quality verdict."""
    data = run.to_dict()
    data.pop("quality", None)
    return data


def _stderr_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


# --------------------------------------------------------------------------- rounds and verdict

def test_rounds_alternate_and_flip_their_order_every_round() -> None:
    assert cc.schedule(4) == [("base", "head"), ("head", "base"), ("base", "head"), ("head", "base")]
    calls: list[tuple[str, int]] = []

    def measure(side: cc.Side, i: int) -> cc.Sample:
        calls.append((side.name, i))
        return cc.Sample(100.0)

    sides = {name: cc.Side(name, name, Path(".")) for name in ("base", "head")}
    samples = cc.run_rounds(3, sides, measure)
    assert calls == [("base", 0), ("head", 0), ("head", 1), ("base", 1), ("base", 2), ("head", 2)]
    assert [set(got) for got in samples] == [{"base", "head"}] * 3


@pytest.mark.parametrize("head, outcome, code", [
    ([1000.0, 1010.0, 995.0], "pass", 0),
    ([700.0, 720.0, 710.0], "fail", 1),
    ([850.0, 990.0, 860.0], "pass", 0),  # median below the bar, the interval reaches above it
])
def test_verdict_on_per_round_rates(head: list[float], outcome: str, code: int) -> None:
    result = cc.verdict([1000.0, 1000.0, 1000.0], head, TH)
    assert (result.outcome, result.exit_code) == (outcome, code)
    assert result.ratio is not None and result.ratio.n == 3
    if head[1] == 990.0:
        assert "not confirmed" in result.reason


def test_too_few_rounds_give_no_verdict() -> None:
    result = cc.verdict([1000.0, 1000.0], [500.0, 500.0], TH)
    assert (result.outcome, result.exit_code, result.reason) == ("no verdict", 2, "no verdict: 2 repeats (needs 3)")


def test_an_untrustworthy_run_withholds_the_verdict_unless_allowed() -> None:
    slow = [700.0, 700.0, 700.0]
    held = cc.verdict([1000.0] * 3, slow, TH, ["head round 2: busy"])
    assert (held.outcome, held.exit_code) == ("no verdict", 2)
    assert "head round 2: busy" in held.reason and "--allow-untrustworthy" in held.reason
    allowed = cc.verdict([1000.0] * 3, slow, TH, ["head round 2: busy"], allow_untrustworthy=True)
    assert (allowed.outcome, allowed.exit_code) == ("fail", 1)


def test_untrustworthy_lists_only_runs_marked_false() -> None:
    samples = [{"base": cc.Sample(1.0, None), "head": cc.Sample(1.0, True)},
               {"base": cc.Sample(1.0, False, ("others took 60 % of the CPU",)), "head": cc.Sample(1.0, True)}]
    assert cc.untrustworthy(samples) == ["base round 2: others took 60 % of the CPU"]


# --------------------------------------------------------------------------- processes and result files

def test_run_command_passes_the_run_options_through(tmp_path: Path) -> None:
    args = build_parser().parse_args(["gate", "--base", "HEAD", "--steps", "512", "--repeats", "3", "--seed", "7",
                                      "--device", "cpu", "--set", "run.warmup_steps=0", "--set", "env.num_envs=4"])
    cmd = cc.run_command("ppo-cartpole", tmp_path / "o.json", args)
    assert cmd[:4] == [sys.executable, "-m", "harness", "run"]
    assert cmd[4:] == ["ppo-cartpole", "--variant", "optimized", "--quiet", "--out", str(tmp_path / "o.json"),
                       "--steps", "512", "--repeats", "3", "--seed", "7", "--device", "cpu",
                       "--set", "run.warmup_steps=0", "--set", "env.num_envs=4"]
    env = cc.child_env(tmp_path)
    assert env["PYTHONPATH"].split(":")[0] == str(tmp_path) and env["OMP_NUM_THREADS"] == "1"


def test_read_sample_takes_the_median_and_the_quality_verdict(tmp_path: Path) -> None:
    run = _without_quality(make_result("optimized", [900.0, 1000.0, 1100.0]))
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema_version": 1, "runs": [make_result("baseline").to_dict(), run]}))
    assert (cc.read_sample(path).rate, cc.read_sample(path).trustworthy) == (1000.0, None)
    run["quality"] = {"trustworthy": False, "reasons": ["load 3.1 on 2 cores"]}
    path.write_text(json.dumps({"schema_version": 1, "runs": [run]}))
    sample = cc.read_sample(path)
    assert (sample.trustworthy, sample.reasons) == (False, ("load 3.1 on 2 cores",))


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("argv, needle", [
    (["--base", "no-such-ref-xyz"], "'no-such-ref-xyz'"),
    (["--base", "HEAD", "--rounds", "2"], "no verdict: 2 repeats (needs 3)"),
    (["--base", "HEAD", "--min-speedup", "2"], "--min-speedup"),
    (["--base", "HEAD", "--baseline", "a.json", "--candidate", "b.json"], "--baseline"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], needle: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(REPO_ROOT)
    before = _worktrees(REPO_ROOT)
    assert main(["gate", *argv]) == 2
    lines = _stderr_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("rlgauge: error:") and needle in lines[0]
    assert _worktrees(REPO_ROOT) == before


def test_outside_a_git_checkout_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert main(["gate", "--base", "HEAD"]) == 2
    assert "not in a git checkout" in capsys.readouterr().err


# --------------------------------------------------------------------------- a tiny repository, fake harness

FAKE_MAIN = textwrap.dedent('''\
    import json, os, sys
    import reference_trainers
    RATE, TRUSTWORTHY = {rate!r}, {trustworthy!r}
    RUN = json.loads({run!r})
    out = sys.argv[sys.argv.index("--out") + 1]
    with open(os.environ["FAKE_HARNESS_LOG"], "a") as log:
        log.write(os.path.abspath(__file__) + " " + os.path.abspath(reference_trainers.__file__) + "\\n")
    RUN["metrics"]["env_steps_per_sec"] = {{"median": RATE, "min": RATE, "max": RATE, "samples": [RATE] * 3}}
    if TRUSTWORTHY is not None:
        RUN["quality"] = {{"trustworthy": TRUSTWORTHY, "reasons": ["other processes took 70 % of the CPU"]}}
    json.dump({{"schema_version": 1, "runs": [RUN]}}, open(out, "w"))
''')


def _fake_main(rate: float, trustworthy: bool | None = None) -> str:
    return FAKE_MAIN.format(rate=rate, trustworthy=trustworthy, run=json.dumps(_without_quality(make_result())))


@pytest.fixture
def fake_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository whose committed fake harness reports 1000 env steps/s; the test edits the
    working tree to change what the head side reports."""
    repo = tmp_path / "repo"
    for package in ("harness", "reference_trainers"):
        (repo / package).mkdir(parents=True)
        (repo / package / "__init__.py").write_text("")
    (repo / "harness" / "__main__.py").write_text(_fake_main(1000.0))
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "fake harness")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("FAKE_HARNESS_LOG", str(tmp_path / "imports.log"))
    return repo


def _imports(repo: Path) -> list[tuple[str, str]]:
    lines = (repo.parent / "imports.log").read_text().splitlines()
    return [tuple(line.split(" ")) for line in lines]  # type: ignore[misc]


def test_base_runs_from_its_worktree_head_from_the_checkout_and_the_worktree_goes(
        fake_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (fake_repo / "harness" / "__main__.py").write_text(_fake_main(500.0))  # head: half the speed
    out = fake_repo.parent / "summary.json"
    assert main(["gate", "--base", "HEAD", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "rlgauge: gate failed: head is slower than base beyond -10 %" in err
    assert "round 2/3: head 500 env steps/s (working tree at" in err
    assert "record no quality verdict" in err
    imports = _imports(fake_repo)
    assert len(imports) == 6
    head = [pair for pair in imports if pair[0] == str(fake_repo / "harness" / "__main__.py")]
    base = [pair for pair in imports if pair not in head]
    assert len(head) == len(base) == 3
    assert all(Path(t).parent.parent.name == "tree" for pair in base for t in pair)  # harness and reference_trainers
    assert all(t.startswith(str(fake_repo)) for pair in head for t in pair)
    assert not Path(base[0][0]).parent.parent.parent.exists()  # the scratch folder is gone
    assert len(_worktrees(fake_repo)) == 1
    summary = json.loads(out.read_text())
    assert summary["verdict"] == "fail" and summary["ratio"]["value"] == 0.5
    assert [r["order"] for r in summary["rounds"]] == [["base", "head"], ["head", "base"], ["base", "head"]]


def test_an_untrustworthy_head_gives_exit_2_unless_allowed(fake_repo: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    (fake_repo / "harness" / "__main__.py").write_text(_fake_main(1000.0, trustworthy=False))
    assert main(["gate", "--base", "HEAD", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "rlgauge: gate --base: no verdict: a run was not trustworthy (head round 1: other processes took" in err
    assert main(["gate", "--base", "HEAD", "--quiet", "--allow-untrustworthy"]) == 0
    assert len(_worktrees(fake_repo)) == 1


def test_a_failing_process_names_its_last_line_and_exits_2(fake_repo: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    (fake_repo / "harness" / "__main__.py").write_text("import sys\nsys.exit('rlgauge: error: unknown preset')\n")
    assert main(["gate", "--base", "HEAD", "--quiet"]) == 2
    lines = _stderr_lines(capsys.readouterr().err)
    assert lines[-1].startswith("rlgauge: error: gate --base: the head run of round 1")
    assert lines[-1].endswith("exited 1: rlgauge: error: unknown preset")
    assert len(_worktrees(fake_repo)) == 1


def test_the_worktree_is_removed_when_interrupted(fake_repo: Path) -> None:
    seen: list[Path] = []

    def interrupted(preset: str, args: argparse.Namespace, scratch: Path) -> cc.Measure:
        def measure(side: cc.Side, i: int) -> cc.Sample:
            seen.append(side.cwd)
            raise KeyboardInterrupt
        return measure

    args = build_parser().parse_args(["gate", "--base", "HEAD", "--quiet"])
    with pytest.raises(KeyboardInterrupt):
        cc.cmd_gate_base(args, measure_with=interrupted)
    assert seen and seen[0].name == "tree" and not seen[0].exists()
    assert len(_worktrees(fake_repo)) == 1


def test_other_dependencies_at_ref_are_noted(fake_repo: Path) -> None:
    (fake_repo / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["torch>=2.4"]\n')
    tree = fake_repo.parent / "other"
    tree.mkdir()
    (tree / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["torch>=2.1"]\n')
    note = cc.dependency_note(fake_repo, tree, "v0.1")
    assert note is not None and "v0.1" in note and "torch>=2.1" in note
    assert cc.dependency_note(fake_repo, fake_repo, "HEAD") is None


# --------------------------------------------------------------------------- one real run

@pytest.mark.slow
def test_gate_base_head_measures_both_sides_for_real(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(REPO_ROOT)
    out = tmp_path / "summary.json"
    code = main(["gate", "--base", "HEAD", "--steps", "256", "--repeats", "3", "--set", "run.warmup_steps=0",
                 "--rounds", "3", "--allow-untrustworthy", "--out", str(out)])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err  # same code on both sides: 1 only on a false alarm of a noisy machine
    summary = json.loads(out.read_text())
    assert len(summary["rounds"]) == 3 and summary["verdict"] in ("pass", "fail")
    assert all(r["base"]["rate"] > 0 and r["head"]["rate"] > 0 for r in summary["rounds"])
    assert "head/base env_steps_per_sec" in captured.out
    print(captured.out + captured.err)  # the table and progress lines, for the log (pytest -rP)
