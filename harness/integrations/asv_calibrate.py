"""``rlgauge asv-calibrate``: the A/A spread of the gated asv suite on this machine, and the factor
to gate ``asv continuous`` with.

A commit with REF's tree (a twin: ``git commit-tree``, no branch or checkout is touched) is
compared with REF by ``asv continuous`` ``--runs`` times. The two trees are identical, so every
difference asv reports is noise. For each run and each benchmark (parameter set) the analysis
applies asv's own rule (``asv.commands.compare._is_result_better``: the ratio beyond the factor
*and* asv's statistics calling the samples different, or the factor alone where asv keeps no
samples): the largest ratio asv would act on is the smallest factor that raises no false alarm.
The recommended factor is the largest of these over the runs, with a margin (``MARGIN``),
rounded up to 0.05 and never below ``MIN_FACTOR``; the false alarms at the factor in use
(``--factor``) are counted with a Wilson 95 % interval.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from harness.errors import UserError

GATED = "RelativeCost|peakmem_"
"""The benchmarks ``make asv-continuous`` gates on (its ``ASV_GATED``)."""
FACTOR = 1.12
"""The factor ``make asv-continuous`` uses (its ``ASV_FACTOR``)."""
MARGIN = 1.05
MIN_FACTOR = 1.1
FILES = ("asv-calibration.json", "asv-calibration.md")


@dataclass
class Pair:
    """One benchmark parameter set in one A/A run: base and twin values, and what asv makes of them."""

    benchmark: str
    params: str
    base: float
    twin: float
    ratio: float
    """max(twin/base, base/twin): the spread, whichever way it went."""
    judged_by_stats: bool
    """asv had several samples on both sides and applied its significance test (else: the factor alone)."""
    acted_on: bool
    """asv would flag this ratio at a factor below it (significant, or no samples to test)."""
    samples: int = 0
    """The fewer samples of the two sides (0: asv kept none)."""

    def never_significant(self) -> bool:
        """asv's test runs but cannot reach its threshold with so few samples: this benchmark can never fail."""
        return self.judged_by_stats and not _can_differ(self.samples)


@dataclass
class Run:
    seconds: float
    returncode: int
    pairs: list[Pair] = field(default_factory=list)

    def needed_factor(self) -> float:
        """The smallest factor at which asv flags nothing in this run (1.0: nothing it would act on)."""
        return max((p.ratio for p in self.pairs if p.acted_on), default=1.0)

    def flagged(self, factor: float) -> list[Pair]:
        return [p for p in self.pairs if p.acted_on and p.ratio > factor]


def recommend(runs: list[Run]) -> float:
    """The largest factor any run needed, times ``MARGIN``, rounded up to 0.05, at least ``MIN_FACTOR``."""
    needed = max((run.needed_factor() for run in runs), default=1.0)
    return max(MIN_FACTOR, math.ceil(needed * MARGIN * 20 - 1e-9) / 20)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of k successes in n trials."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


# --------------------------------------------------------------------------- asv's results

def compare_results(base_file: Path, twin_file: Path) -> list[Pair]:
    """Every benchmark parameter set measured on both sides, judged by asv's own rule."""
    from asv.commands.compare import _is_result_better
    from asv.results import Results

    base, twin = Results.load(str(base_file)), Results.load(str(twin_file))
    pairs = []
    for key in sorted(set(base.get_all_result_keys()) & set(twin.get_all_result_keys())):
        params = base.get_result_params(key)
        combos = [", ".join(map(str, combo)) for combo in _product(params)]
        values = zip(base.get_result_value(key, params), twin.get_result_value(key, params),
                     base.get_result_stats(key, params), twin.get_result_stats(key, params),
                     base.get_result_samples(key, params), twin.get_result_samples(key, params), combos)
        for a, b, stats_a, stats_b, samples_a, samples_b, combo in values:
            if not _measured(a) or not _measured(b) or a <= 0 or b <= 0:
                continue
            ss_a, ss_b = (stats_a, samples_a), (stats_b, samples_b)
            with_stats = bool(stats_a and stats_b and stats_a.get("repeat", 0) != 1 and stats_b.get("repeat", 0) != 1)
            # asv's rule at a factor just above 1: does it act on this pair at all?
            acted = _is_result_better(a, b, ss_a, ss_b, 1.0 + 1e-12) or _is_result_better(b, a, ss_b, ss_a, 1.0 + 1e-12)
            n = min(len(samples_a or ()), len(samples_b or ()))
            pairs.append(Pair(key, combo, a, b, max(a / b, b / a), with_stats, acted, n))
    return pairs


def _can_differ(n: int) -> bool:
    """Whether asv's test can call two sets of ``n`` samples that do not overlap at all different."""
    from asv._stats import is_different

    return n > 0 and is_different([1.0 + i for i in range(n)], [1.0 + n + i for i in range(n)], None, None)


def _measured(value: float | None) -> bool:
    return value is not None and value == value  # None: failed; NaN: skipped


def _product(params: list[list]) -> list[tuple]:
    return list(itertools.product(*params)) if params else [()]


def result_file(results_dir: Path, commit: str) -> Path:
    """The results asv saved for ``commit`` (one machine, one environment: the suite's own set-up)."""
    found = sorted(p for p in results_dir.glob(f"*/{commit[:8]}-*.json"))
    if not found:
        raise UserError(f"asv saved no results for {commit[:8]} in {results_dir}/ (did asv continuous fail?)")
    return max(found, key=lambda p: p.stat().st_mtime)


# --------------------------------------------------------------------------- git and asv

def commit_of(ref: str, cwd: Path) -> str:
    proc = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=cwd,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise UserError(f"--base {ref}: not a commit in this repository; give a branch, a tag, a commit hash or "
                        "e.g. HEAD~1")
    return proc.stdout.strip()


def twin_commit(commit: str, cwd: Path) -> str:
    """A new commit with ``commit``'s tree and ``commit`` as parent; no ref or file changes."""
    env_names = {"GIT_AUTHOR_NAME": "rlgauge", "GIT_AUTHOR_EMAIL": "rlgauge@localhost",
                 "GIT_COMMITTER_NAME": "rlgauge", "GIT_COMMITTER_EMAIL": "rlgauge@localhost"}
    return subprocess.run(["git", "commit-tree", f"{commit}^{{tree}}", "-p", commit, "-m",
                           f"rlgauge asv-calibrate: A/A twin of {commit[:8]}"], cwd=cwd, capture_output=True,
                          text=True, check=True, env={**os.environ, **env_names}).stdout.strip()


def asv_results_dir(cwd: Path) -> Path:
    from asv.util import load_json

    conf = cwd / "asv.conf.json"
    if not conf.is_file():
        raise UserError(f"no asv.conf.json in {cwd}: run rlgauge asv-calibrate at the root of the project")
    return cwd / load_json(str(conf), js_comments=True).get("results_dir", "results")


def run_continuous(base: str, twin: str, bench: str, factor: float, cwd: Path, say: Callable[[str], None]) -> Run:
    command = [sys.executable, "-m", "asv", "continuous", "--factor", str(factor), "-b", bench, base, twin]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise UserError(f"asv continuous failed (exit {proc.returncode}): {tail[0]}")
    results = asv_results_dir(cwd)
    run = Run(seconds, proc.returncode, compare_results(result_file(results, base), result_file(results, twin)))
    say(f"  A/A run: {seconds:.0f} s, asv exit {proc.returncode}, smallest factor without a false alarm "
        f"{run.needed_factor():.3f}")
    return run


# --------------------------------------------------------------------------- the command

def summary(runs: list[Run], factor: float, base: str, bench: str) -> dict:
    alarms = sum(1 for run in runs if run.flagged(factor))
    low, high = wilson(alarms, len(runs))
    return {"base": base, "bench": bench, "factor": factor, "recommended_factor": recommend(runs) if runs else None,
            "false_alarms": alarms, "runs": len(runs), "false_alarm_rate_95ci": [low, high],
            "never_significant": sorted({p.benchmark for run in runs for p in run.pairs if p.never_significant()}),
            "per_run": [{"seconds": round(run.seconds, 1), "asv_exit": run.returncode,
                         "needed_factor": run.needed_factor(),
                         "flagged_at_factor": [f"{p.benchmark}({p.params}) {p.ratio:.3f}" for p in run.flagged(factor)],
                         "pairs": [asdict(p) for p in run.pairs]} for run in runs]}


def markdown(data: dict) -> str:
    low, high = data["false_alarm_rate_95ci"]
    lines = [f"# asv A/A calibration ({data['runs']} runs, base {data['base'][:8]}, -b '{data['bench']}')", "",
             "| run | wall s | asv exit | smallest factor without a false alarm | flagged at the factor in use |",
             "|---|---|---|---|---|"]
    for i, run in enumerate(data["per_run"], 1):
        lines.append(f"| {i} | {run['seconds']:.0f} | {run['asv_exit']} | {run['needed_factor']:.3f} | "
                     f"{'; '.join(run['flagged_at_factor']) or 'none'} |")
    lines += ["", f"False alarms at factor {data['factor']}: {data['false_alarms']}/{data['runs']} runs "
                  f"(95 % interval {low:.0%}-{high:.0%}).",
              f"Recommended: make asv-continuous ASV_FACTOR={data['recommended_factor']:.2f}", ""]
    if data["never_significant"]:
        lines += [f"Warning: too few samples for asv's test to ever call a change significant, so these never fail "
                  f"the gate (give them more repeat x rounds): {', '.join(data['never_significant'])}", ""]
    return "\n".join(lines)


def run_command(args: argparse.Namespace) -> int:
    from harness.results import check_output_dir

    if args.runs < 2:
        raise UserError(f"--runs {args.runs}: at least 2 A/A runs (5 or more for a factor to trust)")
    if not args.factor > 1.0:
        raise UserError(f"--factor {args.factor}: a factor above 1.0 (asv continuous's --factor)")
    try:
        re.compile(args.bench)
    except re.error as exc:
        raise UserError(f"--bench {args.bench!r}: not a regular expression ({exc})") from None
    cwd = Path.cwd()
    results_dir = asv_results_dir(cwd)
    base = commit_of(args.base, cwd)
    out = check_output_dir(args.out or Path("asv-calibration"), files=FILES)
    say = (lambda _text: None) if args.quiet else (lambda text: print(text, file=sys.stderr))
    twin = twin_commit(base, cwd)
    say(f"asv-calibrate: {args.runs} runs of asv continuous -b '{args.bench}' {base[:8]} against {twin[:8]} "
        f"(the same tree), results in {results_dir}/")
    runs: list[Run] = []
    code = 0
    try:
        for _ in range(args.runs):
            runs.append(run_continuous(base, twin, args.bench, args.factor, cwd, say))
    except KeyboardInterrupt:
        code = 130
    data = summary(runs, args.factor, base, args.bench)
    out.mkdir(parents=True, exist_ok=True)
    (out / FILES[0]).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (out / FILES[1]).write_text(markdown(data), encoding="utf-8")
    print(markdown(data), end="")
    return code
