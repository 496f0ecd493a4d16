"""A pytest plugin (entry point ``pytest11``): gate your trainer's speed from your own test suite.

::

    def test_optimised_trainer_is_faster(rlgauge):
        rlgauge.assert_speedup("bench.yaml", min_speedup=1.5)

    def test_no_slowdown_against_the_saved_result(rlgauge):
        rlgauge.assert_no_regression("bench.yaml", baseline="benchmarks/speed.json", max_slowdown_pct=10)

Each assertion runs ``rlgauge gate`` in this process, with its statistics, noise handling and
exit semantics: a pass passes; a failed check fails the test with the gate's table; no verdict
(a run that is not trustworthy because other processes took the CPU, or too few repeats to
decide) skips the test with the gate's reason, as ``gate`` exits 2; bad input (an unknown key,
a trainer that does not import) fails the test with the one-line error. Nothing is imported
until the fixture is used, so the plugin costs nothing in a suite that does not use it.
"""

from __future__ import annotations

import contextlib
import io
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

_NO_VERDICT = re.compile(r"is not trustworthy|no verdict")


@dataclass
class GateOutcome:
    """What one in-process ``rlgauge`` command returned and printed."""

    code: int
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return (self.stdout + self.stderr).strip()


class RlgaugeGate:
    """The ``rlgauge`` fixture: gate assertions over a preset, a trainer file or a factory."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def command(self, *argv: str) -> GateOutcome:
        """Run ``rlgauge ARGV...`` in this process; its exit code and output."""
        from harness.cli import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in argv])
        return GateOutcome(code, out.getvalue(), err.getvalue())

    def target(self, target: str | Path | None = None, *, trainer: str | None = None,
               config: dict[str, Any] | None = None) -> str:
        """A preset name or file; or a trainer file written from ``trainer`` (``MODULE:FACTORY``) and
        ``config`` (its sections: ``config``, ``variants``, ``run``)."""
        if (target is None) == (trainer is None):
            raise ValueError("rlgauge: give a preset or FILE.yaml, or trainer='MODULE:FACTORY' (one of them)")
        if target is not None:
            return str(target)
        import yaml

        path = Path(tempfile.mkstemp(suffix=".yaml", prefix="rlgauge-", dir=self.workdir)[1])
        path.write_text(yaml.safe_dump({"trainer": trainer, **(config or {})}, sort_keys=False))
        return str(path)

    def assert_speedup(self, target: str | Path | None = None, min_speedup: float = 1.0, *,
                       trainer: str | None = None, config: dict[str, Any] | None = None,
                       steps: int | None = None, repeats: int | None = None, sets: tuple[str, ...] = (),
                       allow_untrustworthy: bool = False) -> GateOutcome:
        """The optimized variant is at least ``min_speedup`` x the baseline, both interleaved in this
        process (``rlgauge gate --run``)."""
        argv = ["gate", "--run", self.target(target, trainer=trainer, config=config), "--min-speedup", min_speedup,
                "--quiet", *_run_options(steps, repeats, sets, allow_untrustworthy)]
        return _judge(self.command(*argv), "gate --run")

    def assert_no_regression(self, target: str | Path | None = None, *, baseline: str | Path,
                             max_slowdown_pct: float | None = None, variant: str = "optimized",
                             trainer: str | None = None, config: dict[str, Any] | None = None,
                             steps: int | None = None, repeats: int | None = None, sets: tuple[str, ...] = (),
                             allow_untrustworthy: bool = False) -> GateOutcome:
        """Measure ``variant`` now and gate it against the saved result ``baseline`` (``rlgauge run
        --out`` then ``rlgauge gate --baseline --candidate``): no slowdown beyond ``max_slowdown_pct``."""
        candidate = self.workdir / "rlgauge-candidate.json"
        measured = self.command("run", self.target(target, trainer=trainer, config=config), "--variant", variant,
                                "--out", candidate, "--quiet", *_run_options(steps, repeats, sets, False))
        if measured.code != 0:
            _judge(measured, "run")
        argv = ["gate", "--baseline", baseline, "--candidate", candidate]
        if max_slowdown_pct is not None:
            argv += ["--max-slowdown", max_slowdown_pct]
        if allow_untrustworthy:
            argv.append("--allow-untrustworthy")
        return _judge(self.command(*argv), "gate")


def _run_options(steps: int | None, repeats: int | None, sets: tuple[str, ...], allow_untrustworthy: bool) -> list:
    argv: list[Any] = []
    if steps is not None:
        argv += ["--steps", steps]
    if repeats is not None:
        argv += ["--repeats", repeats]
    for text in sets:
        argv += ["--set", text]
    if allow_untrustworthy:
        argv.append("--allow-untrustworthy")
    return argv


def _judge(outcome: GateOutcome, what: str) -> GateOutcome:
    """``gate``'s exit semantics as test outcomes: 0 pass, 1 fail, 2 skip when no verdict (else fail)."""
    if outcome.code == 0:
        return outcome
    if outcome.code == 130:
        raise KeyboardInterrupt
    if outcome.code == 2 and _NO_VERDICT.search(_error_line(outcome)):
        pytest.skip(f"rlgauge {what}: no verdict on this machine: {_error_line(outcome)}")
    pytest.fail(f"rlgauge {what} exited {outcome.code}:\n{outcome.text}", pytrace=False)
    raise AssertionError  # unreachable: pytest.fail raises


def _error_line(outcome: GateOutcome) -> str:
    lines = [l for l in outcome.stderr.splitlines() if l.startswith("rlgauge: error:")]
    return lines[-1].removeprefix("rlgauge: error: ") if lines else outcome.stderr.strip()[-300:]


@pytest.fixture
def rlgauge(tmp_path: Path) -> Iterator[RlgaugeGate]:
    """Gate assertions on training speed: ``assert_speedup`` and ``assert_no_regression``."""
    yield RlgaugeGate(tmp_path)
