"""Measure how reliably ``rlgauge gate`` flags a planted 20 % slowdown and passes an unchanged build.

    python tests/gate_trials.py --mode run --tries 10      # gate --run (one process, paired)
    python tests/gate_trials.py --mode files --tries 10    # gate --baseline/--candidate (two processes)

Every try runs the real CLI in a fresh subprocess; the slowdown is the product's calibration knob
``run.planted_slowdown_pct`` (each timed iteration busy-waits: 20 = env steps/sec x 0.8): with
``--set`` for a run of one variant (files mode), through ``tests/planted_slowdown.py`` for the
optimised variant alone (run mode). Unchanged and planted tries alternate, so machine drift hits
both alike. Prints one line per try and the two rates. ``rlgauge calibrate`` measures the files
mode's rule (false alarms, detection) at many repeats and thresholds in one interleaved run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PLANT = [sys.executable, str(REPO_ROOT / "tests" / "planted_slowdown.py")]
RLGAUGE = [sys.executable, "-m", "harness"]
SLOWDOWN_PCT = 20  # env steps/sec drop by 20 %


def rlgauge(*argv: str, pct: float = 0.0, only_optimized: bool = False) -> subprocess.CompletedProcess[str]:
    """The CLI with ``run.planted_slowdown_pct = pct``: in every variant, or in the optimized one only."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    if only_optimized:
        cmd = [*PLANT, "--pct", str(pct), "--variant", "optimized", "--", *argv]
    else:
        cmd = [*RLGAUGE, *argv, *(["--set", f"run.planted_slowdown_pct={pct}"] if pct else [])]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=600)


def speedup(path: Path) -> float:
    runs = {r["variant"]: r for r in json.loads(path.read_text())["runs"]}
    b, o = runs["baseline"]["metrics"]["env_steps_per_sec"]["samples"], runs["optimized"]["metrics"]["env_steps_per_sec"]["samples"]
    return statistics.median(x / y for x, y in zip(o, b))


def trials_run(tries: int, measure: list[str], work: Path) -> tuple[int, int]:
    calibration = []
    for i in range(3):
        out = work / f"calibrate{i}.json"
        proc = rlgauge("gate", "--run", "ppo-cartpole", *measure, "--min-speedup", "0.01", "--out", str(out))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        calibration.append(speedup(out))
    minimum = round(0.9 * statistics.median(calibration), 2)
    print(f"calibration speedups {[round(s, 3) for s in calibration]} -> --min-speedup {minimum} "
          f"(0.9 x median; a 20 % slowdown gives ~{0.8 * statistics.median(calibration):.2f})", flush=True)
    passed = flagged = 0
    for i in range(tries):
        for planted in (False, True):
            out = work / f"try{i}-{'planted' if planted else 'unchanged'}.json"
            start = time.perf_counter()
            proc = rlgauge("gate", "--run", "ppo-cartpole", *measure, "--min-speedup", str(minimum), "--out",
                           str(out), pct=SLOWDOWN_PCT if planted else 0.0, only_optimized=True)
            line = next((ln for ln in proc.stdout.splitlines() if "speedup optimized" in ln), "").split("│")
            measured = line[3].strip() if len(line) > 3 else "?"
            ok = proc.returncode == (1 if planted else 0)
            flagged += planted and ok
            passed += (not planted) and ok
            print(f"try {i + 1:2d} {'planted ' if planted else 'unchanged'} exit {proc.returncode} speedup {measured}"
                  f" {'as expected' if ok else 'WRONG'} ({time.perf_counter() - start:.0f} s)", flush=True)
            if proc.returncode not in (0, 1):
                print(proc.stderr, file=sys.stderr)
    return passed, flagged


def trials_files(tries: int, measure: list[str], work: Path, max_slowdown: str) -> tuple[int, int]:
    passed = flagged = 0
    for i in range(tries):
        paths = {}
        for name, pct in (("reference", 0.0), ("unchanged", 0.0), ("planted", SLOWDOWN_PCT)):
            paths[name] = work / f"try{i}-{name}.json"
            proc = rlgauge("run", "ppo-cartpole", "--variant", "optimized", *measure, "--quiet", "--out",
                           str(paths[name]), pct=pct)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        for name in ("unchanged", "planted"):
            proc = rlgauge("gate", "--baseline", str(paths["reference"]), "--candidate", str(paths[name]),
                           "--max-slowdown", max_slowdown)
            line = next((ln for ln in proc.stdout.splitlines() if "env_steps_per_sec" in ln), "").split("│")
            measured = line[3].strip() if len(line) > 3 else "?"
            expected = 1 if name == "planted" else 0
            ok = proc.returncode == expected
            flagged += name == "planted" and ok
            passed += name == "unchanged" and ok
            print(f"try {i + 1:2d} {name:9s} exit {proc.returncode} ratio {measured} "
                  f"{'as expected' if ok else 'WRONG'}", flush=True)
    return passed, flagged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["run", "files"], required=True)
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--steps", default="2048")
    parser.add_argument("--repeats", default="15")
    parser.add_argument("--max-slowdown", default="10")
    args = parser.parse_args()
    measure = ["--device", "cpu", "--steps", args.steps, "--repeats", args.repeats, "--set", "run.warmup_steps=1024",
               "--quiet"]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gate-trials-") as tmp:
        if args.mode == "run":
            passed, flagged = trials_run(args.tries, measure, Path(tmp))
        else:
            passed, flagged = trials_files(args.tries, measure, Path(tmp), args.max_slowdown)
    print(f"{args.mode}: unchanged passed {passed}/{args.tries}, planted 20 % slowdown flagged {flagged}/{args.tries} "
          f"({time.perf_counter() - start:.0f} s)")
    return 0 if passed == flagged == args.tries else 1


if __name__ == "__main__":
    sys.exit(main())
