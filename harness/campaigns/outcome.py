"""The end every measuring command shares: run the arms, write ``runs.json``, stop on interruption, warn about
untrustworthy runs, and turn the runs' status into the exit code (ablate, sweep, matrix)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from harness.campaigns.executors import Executor, LocalExecutor
from harness.campaigns.jobs import Job

from harness.errors import EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_OK  # noqa: F401 (re-exported)


def run_arms(specs: list[Any], executor: Executor | None = None, *, show_progress: bool = False,
             name: str = "arms") -> tuple[list[Any], bool]:
    """Every spec measured interleaved on one machine: here (with a progress bar), or as one job of
    ``executor``; (runs, interrupted)."""
    from harness.measurement.runner import run_variants

    if executor is None or isinstance(executor, LocalExecutor):
        return run_variants(specs, show_progress=show_progress, say=lambda _t: None)
    job = Job(name, run_variants, (specs,))
    gathered = executor.run([job], cpus_per_job=1)
    runs, interrupted = gathered.results.get(job.name, ([], True))
    return runs, interrupted or gathered.interrupted


def save_runs(out: Path, runs: list[Any], interrupted: bool, what: str = "partial runs") -> int | None:
    """``runs.json`` in ``out``; interrupted: say so and return the exit code, else warn about untrustworthy runs
    and return None (the command goes on)."""
    from harness.results import save_results

    save_results(out / "runs.json", runs)
    if interrupted:
        where = out / "runs.json" if what == "partial runs" else f"{out}/"
        print(f"rlgauge: interrupted; {what} written to {where}", file=sys.stderr)
        return EXIT_INTERRUPTED
    warn_untrustworthy(runs)
    return None


def warn_untrustworthy(runs: list[Any]) -> None:
    """One warning line per run whose quality verdict says it is not trustworthy."""
    from harness.stats.compare import untrustworthy_warning

    for run in runs:
        warning = untrustworthy_warning(f"{run.preset}/{run.variant}", run)
        if warning is not None:
            print(warning, file=sys.stderr)


def status_code(runs: list[Any]) -> int:
    """1 when a run is not ``ok`` (each named on stderr), else 0."""
    bad = [r for r in runs if r.status != "ok"]
    for result in bad:
        print(f"rlgauge: {result.variant} run is {result.status}: {result.error or result.stability}", file=sys.stderr)
    return EXIT_CHECK_FAILED if bad else EXIT_OK
