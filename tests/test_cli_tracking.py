"""``rlgauge compare``, ``gate`` and ``record`` through ``harness.cli.main`` (and a real subprocess
for the planted slowdown): exit 0 pass, 1 a check failed (with a table of what failed), 2 bad
input on one line with nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import TINY
from harness.cli import main
from harness.report.runs_md import COLUMNS, HEADER, new_file_text
from results_factory import make_result, write_results

REPO_ROOT = Path(__file__).resolve().parent.parent
TINY_ARGS = [arg for item in TINY for arg in ("--set", item)]
TIGHT = [1000.0, 1002.0, 998.0, 1001.0, 999.0]



def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Result files: a reference build, an unchanged one, a 20 %-slower one, an unstable one."""
    both = lambda factor, **kw: [make_result("baseline", [s * factor for s in TIGHT], **kw),  # noqa: E731
                                 make_result("optimized", [3 * s * factor for s in TIGHT], **kw)]
    return {
        "base": write_results(tmp_path / "base.json", *both(1.0)),
        "same": write_results(tmp_path / "same.json", *both(1.01)),
        "slow": write_results(tmp_path / "slow.json", *both(0.8)),
        "unstable": write_results(tmp_path / "unstable.json", *both(1.0, status="unstable", nonfinite_events=2)),
    }


# --------------------------------------------------------------------------- compare

def test_compare_two_files_prints_each_matched_run_with_intervals(files: dict[str, Path],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "compare", files["base"], files["slow"])
    assert code == 0, err
    flat = " ".join(out.split())
    assert "ppo-cartpole/baseline" in out and "ppo-cartpole/optimized" in out
    assert "0.80x [" in out and "worse, confirmed" in out
    assert "independent (not interleaved: two processes" in flat


def test_compare_one_file_compares_its_variants_paired(files: dict[str, Path],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "compare", files["base"])
    assert code == 0, err
    assert "3.00x [3.00-3.00]" in out and "paired (repeats interleaved" in " ".join(out.split())


def test_compare_notes_different_machines_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = make_result("optimized")
    other.machine["cpu"] = "Apple M3"
    code, _, err = run_cli(capsys, "compare", write_results(tmp_path / "a.json", make_result("optimized")),
                           write_results(tmp_path / "b.json", other))
    assert code == 0 and "different machines (cpu differ)" in err


# --------------------------------------------------------------------------- gate: two files

def test_gate_passes_an_unchanged_build(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "gate", "--baseline", files["base"], "--candidate", files["same"])
    assert code == 0, out
    assert "gate passed" in err and "FAIL" not in out


def test_gate_fails_a_confirmed_20_percent_slowdown_with_a_table_of_failures(
        files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "gate", "--baseline", files["base"], "--candidate", files["slow"])
    assert code == 1
    failed_table = out[out.index("failed: 2 of"):]
    assert failed_table.count("FAIL") == 2 and "ppo-cartpole/baseline" in failed_table
    assert "gate failed: 2 of" in err


def test_gate_max_slowdown_on_the_command_line_overrides_the_file(files: dict[str, Path],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run_cli(capsys, "gate", "--baseline", files["base"], "--candidate", files["slow"],
                         "--max-slowdown", "25")
    assert code == 0


def test_gate_fails_an_unstable_candidate_even_at_full_speed(files: dict[str, Path],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "gate", "--baseline", files["base"], "--candidate", files["unstable"])
    assert code == 1
    failures = out[out.index("failed:"):]
    assert "nonfinite_events" in failures and "status" in failures and "candidate/baseline" not in failures


def test_gate_reads_a_thresholds_file(files: dict[str, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    loose = tmp_path / "gates.yaml"
    loose.write_text("max_slowdown_pct: 30\n", encoding="utf-8")
    assert run_cli(capsys, "gate", "--baseline", files["base"], "--candidate", files["slow"],
                   "--thresholds", loose)[0] == 0


# --------------------------------------------------------------------------- gate: --run (one process)

def test_gate_run_measures_both_variants_and_passes_a_reachable_minimum(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "gate.json"
    code, out, err = run_cli(capsys, "gate", "--run", "ppo-cartpole", *TINY_ARGS, "--repeats", "3",
                             "--min-speedup", "0.05", "--out", out_file, "--quiet",
                             "--allow-untrustworthy")  # tiny runs on a shared machine: gate anyway
    assert code == 0, out + err
    assert "speedup optimized/baseline" in out and ">= 0.05x" in out
    runs = json.loads(out_file.read_text(encoding="utf-8"))["runs"]
    assert [r["variant"] for r in runs] == ["baseline", "optimized"]
    assert all(len(r["metrics"]["env_steps_per_sec"]["samples"]) == 3 for r in runs)


def test_gate_run_fails_an_unreachable_minimum_speedup(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "gate", "--run", "ppo-cartpole", *TINY_ARGS, "--repeats", "3",
                             "--min-speedup", "1000", "--quiet", "--allow-untrustworthy")
    assert code == 1, out + err
    assert "failed: " in out, out + err
    failures = out[out.index("failed: "):]
    assert "speedup optimized/baseline" in failures and "FAIL" in failures, out + err


def _planted(*argv: str, factor: float, variant: str = "optimized") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "planted_slowdown.py"), "--factor", str(factor),
                           "--variant", variant, "--", *argv], capture_output=True, text=True, cwd=REPO_ROOT,
                          env=env, timeout=300)


@pytest.mark.slow
@pytest.mark.serial  # three timed runs compared with each other: another test worker's load shifts them apart
def test_gate_run_flags_a_slowdown_planted_in_the_optimized_variant_and_passes_without_it() -> None:
    """The optimized variant made 2x slower in a subprocess: its speedup halves and the gate fails."""
    common = ["gate", "--run", "ppo-cartpole", "--device", "cpu", "--steps", "4096", "--repeats", "5",
              "--set", "run.warmup_steps=1024", "--quiet", "--allow-untrustworthy"]
    calibrate = _planted(*common, "--min-speedup", "0.01", factor=1.0)
    assert calibrate.returncode == 0, calibrate.stdout + calibrate.stderr
    speedup = float(next(line for line in calibrate.stdout.splitlines() if "speedup optimized" in line)
                    .split("│")[3].split("x")[0])
    minimum = f"{0.75 * speedup:.2f}"
    unchanged, slowed = _planted(*common, "--min-speedup", minimum, factor=1.0), _planted(*common, "--min-speedup",
                                                                                          minimum, factor=2.0)
    assert unchanged.returncode == 0, unchanged.stdout
    assert slowed.returncode == 1, slowed.stdout
    assert "speedup optimized/baseline" in slowed.stdout[slowed.stdout.index("failed:"):]


# --------------------------------------------------------------------------- record

def test_record_appends_one_row_per_run_under_the_header(files: dict[str, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    runs_md = tmp_path / "RUNS.md"
    code, _, err = run_cli(capsys, "record", "--milestone", "v1", files["base"], files["slow"], "--runs-md", runs_md)
    assert code == 0, err
    assert "appended 4 rows" in err
    lines = runs_md.read_text(encoding="utf-8").splitlines()
    rows = lines[lines.index(HEADER) + 2:]
    assert len(rows) == 4 and all(" v1 " in r for r in rows)
    assert " 3.00x [3.00-3.00] " in rows[1]  # the optimized run of base.json, paired with its baseline


def test_record_a_real_run_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result, runs_md = tmp_path / "r.json", tmp_path / "RUNS.md"
    assert run_cli(capsys, "run", "ppo-cartpole", *TINY_ARGS, "--quiet", "--out", result)[0] == 0
    code, _, err = run_cli(capsys, "record", "--milestone", "tiny", result, "--runs-md", runs_md)
    assert code == 0, err
    rows = runs_md.read_text(encoding="utf-8").splitlines()[-2:]
    assert [r.split("|")[COLUMNS.index("variant") + 1].strip() for r in rows] == ["baseline", "optimized"]
    assert all(r.rstrip(" |").endswith("passed") for r in rows)


# --------------------------------------------------------------------------- bad input: exit 2, one line, nothing written

def _corrupt(tmp: Path) -> Path:
    path = tmp / "corrupt.json"
    path.write_text('{"schema_version": 1, "runs": [', encoding="utf-8")
    return path


def _foreign(tmp: Path) -> Path:
    path = tmp / "foreign.json"
    path.write_text(json.dumps({"benchmarks": {"x": 1}}), encoding="utf-8")
    return path


def _broken_runs_md(tmp: Path) -> Path:
    path = tmp / "RUNS.md"
    path.write_text(new_file_text() + "| only | three | cells |\n", encoding="utf-8")
    return path


def _plain_config(tmp: Path) -> Path:
    path = tmp / "mine.yaml"
    path.write_text("env: {id: CartPole-v1}\n", encoding="utf-8")
    return path


def _acrobot(tmp: Path) -> Path:
    return write_results(tmp / "acrobot.json", make_result("baseline", preset="ppo-acrobot"),
                         make_result("optimized", preset="ppo-acrobot"))


BAD: dict[str, tuple[Callable[[Path, dict[str, Path]], list[Any]], str]] = {
    "compare: missing file": (lambda t, f: ["compare", f["base"], t / "nope.json"], "not found"),
    "compare: corrupt JSON": (lambda t, f: ["compare", f["base"], _corrupt(t)], "not valid JSON"),
    "compare: foreign JSON": (lambda t, f: ["compare", _foreign(t), f["base"]], "not an rlgauge result file"),
    "compare: nothing in common": (lambda t, f: ["compare", f["base"], _acrobot(t)], "no preset/variant in common"),
    "compare: three files": (lambda t, f: ["compare", f["base"], f["same"], f["slow"]], "one or two"),
    "compare: one single-run file": (lambda t, f: ["compare", write_results(t / "one.json", make_result())],
                                     "nothing to compare"),
    "gate: no mode": (lambda t, f: ["gate"], "either --baseline"),
    "gate: both modes": (lambda t, f: ["gate", "--run", "ppo-cartpole", "--baseline", f["base"],
                                       "--candidate", f["same"]], "not both"),
    "gate: baseline alone": (lambda t, f: ["gate", "--baseline", f["base"]], "go together"),
    "gate: corrupt candidate": (lambda t, f: ["gate", "--baseline", f["base"], "--candidate", _corrupt(t)],
                                "not valid JSON"),
    "gate: foreign baseline": (lambda t, f: ["gate", "--baseline", _foreign(t), "--candidate", f["base"]],
                               "not an rlgauge result file"),
    "gate: slowdown out of range": (lambda t, f: ["gate", "--baseline", f["base"], "--candidate", f["same"],
                                                  "--max-slowdown", "150"], "--max-slowdown"),
    "gate: slowdown not a number": (lambda t, f: ["gate", "--baseline", f["base"], "--candidate", f["same"],
                                                  "--max-slowdown", "ten"], "--max-slowdown"),
    "gate: min-speedup with files": (lambda t, f: ["gate", "--baseline", f["base"], "--candidate", f["same"],
                                                   "--min-speedup", "2"], "--min-speedup applies to --run"),
    "gate: max-slowdown with --run": (lambda t, f: ["gate", "--run", "ppo-cartpole", "--max-slowdown", "5"],
                                      "--max-slowdown applies"),
    "gate: unknown preset": (lambda t, f: ["gate", "--run", "ppo-cartpol"], "did you mean 'ppo-cartpole'"),
    "gate: negative min-speedup": (lambda t, f: ["gate", "--run", "ppo-cartpole", "--min-speedup", "-1"],
                                   "--min-speedup"),
    "gate: config file without variants": (lambda t, f: ["gate", "--run", _plain_config(t)], "needs a preset"),
    "gate: bad --set": (lambda t, f: ["gate", "--run", "ppo-cartpole", "--set", "env.num_envs=0"], "env.num_envs"),
    "gate: broken thresholds": (lambda t, f: ["gate", "--baseline", f["base"], "--candidate", f["same"],
                                              "--thresholds", _corrupt(t)], "malformed YAML"),
    "record: no milestone": (lambda t, f: ["record", f["base"], "--runs-md", t / "RUNS.md"], "--milestone"),
    "record: empty milestone": (lambda t, f: ["record", "--milestone", " ", f["base"], "--runs-md", t / "RUNS.md"],
                                "--milestone"),
    "record: one bad file among good": (lambda t, f: ["record", "--milestone", "m", f["base"], _corrupt(t),
                                                      "--runs-md", t / "RUNS.md"], "not valid JSON"),
    "record: broken RUNS.md": (lambda t, f: ["record", "--milestone", "m", f["base"], "--runs-md",
                                             _broken_runs_md(t)], "broken table row"),
    "record: RUNS.md is a folder": (lambda t, f: ["record", "--milestone", "m", f["base"], "--runs-md", t],
                                    "is a directory"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(case: str, tmp_path: Path, files: dict[str, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    build, needle = BAD[case]
    argv = build(tmp_path, files)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    code, out, err = run_cli(capsys, *argv)

    assert code == 2, out + err
    assert err.startswith("rlgauge: error: ") and len(err.splitlines()) == 1, err
    assert needle in err
    assert "Traceback" not in err and out == ""
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".lock"} == before
