"""``rlgauge asv-calibrate`` and the Makefile's asv gate: the factor comes from A/A runs judged by asv's
own rule, bad input stops with one line (exit 2) before any set-up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.integrations import asv_calibrate as ac
from harness.cli import main

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "asv_aa"


def _pair(ratio: float, acted: bool, name: str = "bench_x.Y.time_z") -> ac.Pair:
    return ac.Pair(name, "ppo-cartpole, baseline, cpu", 1.0, ratio, ratio, acted, acted)


def test_a_run_needs_the_largest_ratio_asv_acts_on_and_ignores_the_rest() -> None:
    run = ac.Run(10.0, 0, [_pair(1.05, True), _pair(1.9, False), _pair(1.12, True)])
    assert run.needed_factor() == pytest.approx(1.12)
    assert [p.ratio for p in run.flagged(1.1)] == [1.12]
    assert run.flagged(1.12) == []  # asv flags a ratio beyond the factor, not at it
    assert ac.Run(1.0, 0, [_pair(3.0, False)]).needed_factor() == 1.0


def test_recommended_factor_is_the_worst_run_with_a_margin_rounded_up_and_floored() -> None:
    runs = [ac.Run(1.0, 0, [_pair(1.10, True)]), ac.Run(1.0, 1, [_pair(1.21, True)])]
    assert ac.recommend(runs) == pytest.approx(1.3)  # 1.21 * 1.05 = 1.2705 -> 1.30
    assert ac.recommend([ac.Run(1.0, 0, [_pair(1.02, True)])]) == ac.MIN_FACTOR
    assert ac.recommend([ac.Run(1.0, 0, [_pair(1.0476, True)])]) == pytest.approx(1.1)


def test_false_alarms_count_runs_flagged_at_the_factor_with_a_wilson_interval() -> None:
    runs = [ac.Run(1.0, 0, [_pair(1.05, True)]), ac.Run(1.0, 1, [_pair(1.4, True)]),
            ac.Run(1.0, 0, [_pair(2.0, False)])]
    data = ac.summary(runs, 1.2, "a" * 40, "CpuTime")
    assert data["false_alarms"] == 1 and data["runs"] == 3
    low, high = data["false_alarm_rate_95ci"]
    assert 0 < low < 1 / 3 < high < 1
    assert data["per_run"][1]["flagged_at_factor"] == ["bench_x.Y.time_z(ppo-cartpole, baseline, cpu) 1.400"]
    text = ac.markdown(data)
    assert "False alarms at factor 1.2: 1/3 runs" in text and "ASV_FACTOR=1.50" in text


def test_a_benchmark_with_too_few_samples_for_asvs_test_is_reported_as_never_failing() -> None:
    few = ac.Pair("bench_x.Y.time_few", "", 1.0, 1.5, 1.5, True, False, 6)  # 6 a side: p >= 0.0022
    enough = ac.Pair("bench_x.Y.time_enough", "", 1.0, 1.01, 1.01, True, False, 9)
    single = ac.Pair("bench_x.peakmem_one", "", 1.0, 1.0, 1.0, False, False, 0)
    assert few.never_significant() and not enough.never_significant() and not single.never_significant()
    data = ac.summary([ac.Run(1.0, 0, [few, enough, single])], 1.2, "a" * 40, "x")
    assert data["never_significant"] == ["bench_x.Y.time_few"]
    assert "never fail the gate" in ac.markdown(data) and "bench_x.Y.time_few" in ac.markdown(data)


def test_wilson_interval_of_no_alarms_in_five_runs_still_allows_some() -> None:
    low, high = ac.wilson(0, 5)
    assert low == 0.0 and 0.4 < high < 0.5


def test_asv_results_are_judged_by_asvs_rule_significant_and_not() -> None:
    """Two results files asv saved for the same tree: a real A/A run of the gated suite when it took 3 x 2
    samples a side, which asv's test can never call different (hence 3 x 3 now)."""
    base, twin = sorted(DATA.glob("*.json"))
    pairs = ac.compare_results(base, twin)
    assert pairs, "no benchmark measured on both sides"
    names = {p.benchmark for p in pairs}
    assert any("CpuTime" in name for name in names)
    for p in pairs:
        assert p.ratio >= 1.0 and p.ratio == pytest.approx(max(p.base / p.twin, p.twin / p.base))
        if "peakmem" in p.benchmark:  # one value per commit: asv judges it by the factor alone
            assert not p.judged_by_stats and p.acted_on == (p.ratio > 1.0)
        else:
            assert p.judged_by_stats and p.samples == 6 and p.never_significant()  # the 3 x 2 suite of that run


@pytest.mark.parametrize("argv, message", [
    (["--runs", "1"], "--runs 1: at least 2"),
    (["--factor", "1.0"], "--factor 1.0: a factor above 1.0"),
    (["--bench", "("], "not a regular expression"),
    (["--base", "no-such-ref"], "--base no-such-ref: not a commit"),
])
def test_bad_input_exits_2_with_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(REPO_ROOT)
    code = main(["asv-calibrate", *argv, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_the_twin_commit_has_the_same_tree_and_moves_no_ref(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("needs git")
    env_args = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f.txt").write_text("x", encoding="utf-8")
    subprocess.run(["git", *env_args, "add", "f.txt"], cwd=tmp_path, check=True)
    subprocess.run(["git", *env_args, "commit", "-qm", "one"], cwd=tmp_path, check=True)
    head = ac.commit_of("HEAD", tmp_path)
    twin = ac.twin_commit(head, tmp_path)

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()

    assert twin != head and git("rev-parse", f"{twin}^{{tree}}") == git("rev-parse", f"{head}^{{tree}}")
    assert git("rev-parse", f"{twin}^") == head and git("rev-parse", "HEAD") == head


@pytest.mark.parametrize("variable", ["BASE", "HEAD_REF"])
def test_make_asv_continuous_refuses_an_unknown_ref_in_one_line_before_any_set_up(variable: str) -> None:
    if shutil.which("make") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("needs make and the project's git checkout")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # as a user types it,
    proc = subprocess.run(["make", "asv-continuous", f"{variable}=nonexistent-ref", f"VENV={sys.prefix}"],  # not
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False, env=env)  # under make test
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert f"{variable}=nonexistent-ref is not a commit" in lines[0] and "HEAD~1" in lines[0]


TOY_CONF = """{
    "version": 1, "project": "toy", "repo": ".", "branches": ["main"],
    "environment_type": "virtualenv", "pythons": ["%d.%d"], "matrix": {},
    "build_command": ["python -mpip wheel --no-deps --no-build-isolation -w {build_cache_dir} {build_dir}"],
    "install_command": ["in-dir={env_dir} python -mpip install --no-deps {wheel_file}"],
    "uninstall_command": ["return-code=any python -mpip uninstall -y {project}"],
    "benchmark_dir": "benchmarks", "env_dir": ".asv/env", "results_dir": ".asv/results", "html_dir": ".asv/html"
}
"""
TOY_BENCH = """import time


def _cpu(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


class Toy:
    timer = staticmethod(time.process_time)
    number, repeat, rounds, warmup_time = 1, 2, 3, 0.0

    def time_burn(self):
        _cpu(0.01)


def peakmem_list():
    [0] * 100_000
"""


@pytest.mark.slow
def test_asv_calibrate_runs_asv_continuous_against_a_twin_and_writes_its_verdict(tmp_path: Path) -> None:
    """End to end on a toy project (no torch): two A/A runs, a recommendation, both files written."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo, home = tmp_path / "toy", tmp_path / "home"
    (repo / "benchmarks").mkdir(parents=True)
    home.mkdir()
    (repo / "asv.conf.json").write_text(TOY_CONF % sys.version_info[:2], encoding="utf-8")
    (repo / "benchmarks" / "__init__.py").write_text("", encoding="utf-8")
    (repo / "benchmarks" / "bench_toy.py").write_text(TOY_BENCH, encoding="utf-8")
    (repo / "pyproject.toml").write_text('[project]\nname = "toy"\nversion = "0"\n[tool.setuptools]\npy-modules = []\n',
                                         encoding="utf-8")
    env = {**__import__("os").environ, "HOME": str(home)}
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "toy"]):
        subprocess.run([*git, *args], cwd=repo, check=True, env=env)
    subprocess.run([sys.executable, "-m", "asv", "machine", "--yes"], cwd=repo, check=True, env=env,
                   capture_output=True)
    proc = subprocess.run([sys.executable, "-m", "harness", "asv-calibrate", "--runs", "2", "--bench", "Toy|peakmem",
                           "--out", str(tmp_path / "out")], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count("A/A run:") == 2 and "Recommended: make asv-continuous ASV_FACTOR=" in proc.stdout
    data = __import__("json").loads((tmp_path / "out" / "asv-calibration.json").read_text(encoding="utf-8"))
    assert data["runs"] == 2 and data["recommended_factor"] >= ac.MIN_FACTOR
    benchmarks = {pair["benchmark"] for run in data["per_run"] for pair in run["pairs"]}
    assert benchmarks == {"bench_toy.Toy.time_burn", "bench_toy.peakmem_list"}
    assert subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip() \
        == data["base"]  # the checkout's HEAD did not move


def test_the_defaults_are_the_makefiles_gate() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert f"ASV_FACTOR ?= {ac.FACTOR}\n" in makefile and f"ASV_GATED ?= {ac.GATED}\n" in makefile


@pytest.mark.parametrize("report_only", [False, True])
def test_asv_report_only_keeps_asvs_verdict_from_failing_make(report_only: bool) -> None:
    if shutil.which("make") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("needs make and the project's git checkout")
    venv = Path(sys.prefix)
    args = ["make", "-n", "-o", f"{venv}/.rlgauge-installed", "asv-continuous", f"VENV={venv}", "BASE=HEAD"]
    proc = subprocess.run([*args, *(["ASV_REPORT_ONLY=1"] if report_only else [])], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    line = next(line for line in proc.stdout.splitlines() if " continuous " in line)
    assert f"--factor {ac.FACTOR} -b '{ac.GATED}'" in line
    assert ('[ $status -ne 0 ] && [ -n "1" ]' in proc.stdout) == report_only
