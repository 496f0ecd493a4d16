"""The gates the project ships, each run on a plant commit against the base and read as caught, missed or
no verdict.

``gate`` (one process), ``gate --base`` (alternating processes of two commits), the pytest plugin
(``assert_no_regression`` against the base's saved result) and the project's own flag-effect and parity
property tests run once per plant commit; asv's relative costs and cost counts come from one ``asv run``
over the base and every plant commit, compared pairwise (``asv compare``) at the Makefile's factors.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CAUGHT, MISSED, NO_VERDICT, FAILED = "caught", "missed", "no verdict", "error"

GATE_PRESET = "ppo-cartpole"
ONE_PROCESS_ARGS = ("--min-speedup", "2.0", "--steps", "2048", "--repeats", "9", "--set", "run.warmup_steps=1024")
"""``make gate``'s settings."""
CROSS_COMMIT_ARGS = ("--steps", "2048", "--repeats", "3", "--set", "run.warmup_steps=1024", "--rounds", "9",
                     "--max-slowdown", "10")
"""``make gate-base``'s settings."""
PLUGIN_ARGS = {"steps": 2048, "repeats": 5, "max_slowdown_pct": 10}
TESTS = ("tests/properties", "tests/test_flag_effects_ppo.py", "tests/test_flag_effects_value.py",
         "tests/test_flag_effects_settings.py", "tests/test_flag_effects_env.py", "tests/test_flag_registry.py")
"""The parity property tests and the flag-effect tests (``make test`` runs them in CI)."""
ASV_TIMING = (r"RelativeCost|peakmem_", 1.12)
ASV_COUNTS = (r"CostCounts\.track_(acting_)?(aten_ops|host_syncs|float64_ops|output_bytes|python_calls)", 1.001)
"""asv's gated benchmarks and factors, as ``make asv-continuous`` has them."""

ONE_PROCESS, CROSS_COMMIT, ASV_RELATIVE, ASV_COUNT, PLUGIN, PROPERTY_TESTS = (
    "gate", "gate --base", "asv relative costs", "asv counts", "pytest plugin", "parity/flag tests")
GATES = (ONE_PROCESS, CROSS_COMMIT, ASV_RELATIVE, ASV_COUNT, PLUGIN, PROPERTY_TESTS)
IN_CI = (ONE_PROCESS, CROSS_COMMIT, ASV_RELATIVE, ASV_COUNT, PROPERTY_TESTS)
"""What ``.ci/run`` runs (the pytest plugin is for users' own suites)."""
TIMEOUT_S = 3600

_SLOWDOWNS = ("same_thread_10", "same_thread_20", "same_thread_30", "busy_thread", "thread_count")
BLIND: dict[str, dict[str, str]] = {
    ASV_COUNT: {"busy_thread": "the counts are of the training thread's own work: a thread beside it adds none",
                "thread_count": "the same ops and calls on any number of threads"},
    PROPERTY_TESTS: {plant: "they check numbers, dtypes and what each flag does: a slowdown that changes none of "
                            "them is not theirs to see" for plant in _SLOWDOWNS},
}
"""The plants a gate cannot see by design (gate -> plant -> why): not measured; the table says so, and every such
row is caught by another gate CI runs."""


def blind(gate: str, plant: str) -> str | None:
    """Why ``gate`` cannot see ``plant`` by design, or None where it is measured."""
    return BLIND.get(gate, {}).get(plant)


@dataclass(frozen=True)
class Verdict:
    outcome: str
    detail: str
    seconds: float
    cost: dict[str, float] | None = None
    """The asv relative costs' head / base ratios: median of the training and of the acting costs (what a plant
    measurably cost the trainers)."""

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"outcome": self.outcome, "detail": self.detail, "seconds": round(self.seconds, 1)}
        if self.cost is not None:
            out["cost"] = self.cost
        return out


def _ratio(text: str) -> float | None:
    try:
        return float(text.strip("~ "))
    except ValueError:
        return None


def median_costs(rows: Sequence[tuple[str, str, str]]) -> dict[str, float] | None:
    """The median head / base ratio of the relative training costs and of the relative acting costs."""
    out = {}
    for name, pattern in (("training", "track_training_cost"), ("acting", "track_acting_cost")):
        ratios = sorted(r for _, text, bench in rows if pattern in bench and (r := _ratio(text)) is not None)
        if ratios:
            out[name] = round(statistics.median(ratios), 3)
    return out or None


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(command: Sequence[str], clone: Path, timeout: float = TIMEOUT_S) -> tuple[int, str, float]:
    start = time.monotonic()
    try:
        done = subprocess.run(list(command), cwd=clone, env=_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s", time.monotonic() - start
    return done.returncode, (done.stdout + done.stderr), time.monotonic() - start


def last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _from_gate_code(code: int, output: str, seconds: float) -> Verdict:
    if code == 0:
        return Verdict(MISSED, last_line(output), seconds)
    if code == 1:
        return Verdict(CAUGHT, last_line(output), seconds)
    if code == 2 and "not trustworthy" in output:
        return Verdict(NO_VERDICT, last_line(output), seconds)
    return Verdict(FAILED, f"exit {code}: {last_line(output)}", seconds)


def one_process(clone: Path) -> Verdict:
    """``make gate``: optimized vs baseline of the plant commit, interleaved in one process."""
    code, out, seconds = _run([sys.executable, "-m", "harness", "gate", "--run", GATE_PRESET, *ONE_PROCESS_ARGS,
                               "--quiet"], clone)
    return _from_gate_code(code, out, seconds)


def cross_commit(clone: Path, base: str) -> Verdict:
    """``make gate-base``: the plant commit against the base, alternating processes."""
    code, out, seconds = _run([sys.executable, "-m", "harness", "gate", "--base", base, "--run", GATE_PRESET,
                               *CROSS_COMMIT_ARGS], clone)
    return _from_gate_code(code, out, seconds)


PLUGIN_TEST = '''
def test_no_regression_against_the_base(rlgauge):
    rlgauge.assert_no_regression({preset!r}, baseline={baseline!r}, steps={steps}, repeats={repeats},
                                 max_slowdown_pct={max_slowdown_pct})
'''


def plugin_baseline(clone: Path, out: Path) -> tuple[int, str]:
    """The base commit's saved result for the plugin's ``assert_no_regression`` (run with the base checked out)."""
    code, output, _ = _run([sys.executable, "-m", "harness", "run", GATE_PRESET, "--variant", "optimized",
                            "--steps", str(PLUGIN_ARGS["steps"]), "--repeats", str(PLUGIN_ARGS["repeats"]),
                            "--quiet", "--out", str(out)], clone)
    return code, last_line(output)


def plugin(clone: Path, baseline: Path, scratch: Path) -> Verdict:
    """The pytest plugin in a user's suite: ``assert_no_regression`` of the plant commit against the base's result."""
    test = scratch / "test_rlgauge_plugin_gate.py"
    test.write_text(PLUGIN_TEST.format(preset=GATE_PRESET, baseline=str(baseline), **PLUGIN_ARGS), encoding="utf-8")
    code, out, seconds = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
                               str(scratch), str(test)], clone)
    if code == 0 and " skipped" in out:
        return Verdict(NO_VERDICT, last_line(out), seconds)
    return Verdict(MISSED if code == 0 else CAUGHT if code == 1 else FAILED, last_line(out), seconds)


def property_tests(clone: Path) -> Verdict:
    """The flag-effect tests and the parity property tests of the plant commit (``make test`` runs them)."""
    code, out, seconds = _run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "2",
                               "-m", "not slow", *TESTS], clone)
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    detail = failed[0][:300] if failed else last_line(out)
    if code == 0:
        return Verdict(MISSED, detail, seconds)
    # -x under xdist ends a run with a failed test as interrupted (exit 2): a failed test is what was caught
    return Verdict(CAUGHT if failed and code in (1, 2) else FAILED, detail, seconds)


def _compare_rows(output: str) -> list[tuple[str, str, str]]:
    """``asv compare``'s rows as (change mark, ratio, benchmark); its table is ``| change | before | after |
    ratio | benchmark |``."""
    rows = []
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and "." in cells[4] and not cells[4].startswith("Benchmark"):
            rows.append((cells[0], cells[3], cells[4]))
    return rows


def asv_run(clone: Path, config: Path, commits: Sequence[str]) -> tuple[int, str, float]:
    """One ``asv run`` of the gated benchmarks over every commit (each measured in its own processes); a commit this
    run's results already hold (an interrupted run) is not measured again."""
    hashfile = config.with_suffix(".commits")
    hashfile.write_text("\n".join(commits) + "\n", encoding="utf-8")
    pattern = f"({ASV_TIMING[0]})|({ASV_COUNTS[0]})"
    return _run([sys.executable, "-m", "asv", "run", "--config", str(config), "--skip-existing-commits", "-b",
                 pattern, f"HASHFILE:{hashfile}"], clone, timeout=TIMEOUT_S * 4)


def asv_verdicts(clone: Path, config: Path, base: str, commit: str, seconds: float) -> dict[str, Verdict]:
    """The relative-cost and count gates of one plant commit against the base, from the stored results."""
    verdicts = {}
    for gate, (pattern, factor) in ((ASV_RELATIVE, ASV_TIMING), (ASV_COUNT, ASV_COUNTS)):
        code, out, _ = _run([sys.executable, "-m", "asv", "compare", "--config", str(config), "--factor", str(factor),
                             "--no-only-changed", base, commit], clone, timeout=600)
        if code != 0:
            verdicts[gate] = Verdict(FAILED, f"asv compare exit {code}: {last_line(out)}", seconds)
            continue
        worse, measured = [], 0
        for mark, ratio, benchmark in _compare_rows(out):
            if not re.search(pattern, benchmark):
                continue
            measured += 1
            if mark == "+":
                worse.append(f"{benchmark.split('.', 1)[-1]} {ratio}")
            elif mark == "!":  # asv continuous fails on a benchmark the head broke (e.g. timed out): CI stops it
                worse.append(f"{benchmark.split('.', 1)[-1]} failed on the head commit")
        if measured == 0:
            verdicts[gate] = Verdict(FAILED, "asv compare listed none of the gated benchmarks", seconds)
        else:
            verdicts[gate] = Verdict(CAUGHT if worse else MISSED, "; ".join(worse[:4]) + (
                f" (+{len(worse) - 4} more)" if len(worse) > 4 else ""), seconds,
                median_costs(_compare_rows(out)) if gate == ASV_RELATIVE else None)
    return verdicts
