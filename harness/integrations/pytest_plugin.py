"""A pytest plugin (entry point ``pytest11``): gate your trainer's speed from your own test suite.

::

    def test_optimised_trainer_is_faster(rlgauge):
        rlgauge.assert_speedup("bench.yaml", min_speedup=1.5)

    def test_no_slowdown_against_the_saved_result(rlgauge):
        rlgauge.assert_no_regression("bench.yaml", baseline="benchmarks/speed.json", max_slowdown_pct=10)

Each assertion runs ``harness.gate`` in this process (``rlgauge gate`` with its statistics and noise
handling) and acts on its typed outcome: a pass passes; a failed check fails the test with the gate's
table; no verdict (a run that is not trustworthy because other processes took the CPU, or too few
repeats to decide) skips the test with the gate's reason and names it in a summary section; bad input
(an unknown key, a trainer that does not import) fails the test with the one-line error. Nothing is
imported until the fixture is used, so the plugin costs nothing in a suite that does not use it.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import pytest

if TYPE_CHECKING:
    from harness.analyses.gate_outcome import GateVerdict

_NO_VERDICTS = pytest.StashKey[list]()


@dataclass
class GateOutcome:
    """What one in-process ``rlgauge`` command returned and printed."""

    code: int
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return (self.stdout + self.stderr).strip()


@dataclass
class RlgaugeGate:
    """The ``rlgauge`` fixture: gate assertions over a preset, a trainer file or a factory."""

    workdir: Path
    no_verdicts: list[tuple[str, str]] = field(default_factory=list)
    """(test id, reason) of each gate that gave no verdict: the session's summary lists them."""
    test_id: str = ""

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
                       allow_untrustworthy: bool = False) -> GateVerdict:
        """The optimized variant is at least ``min_speedup`` x the baseline, both interleaved in this
        process (``rlgauge gate --run``)."""
        from harness.integrations.gate_api import gate

        verdict = gate(self.target(target, trainer=trainer, config=config), min_speedup=min_speedup, steps=steps,
                       repeats=repeats, sets=sets, allow_untrustworthy=allow_untrustworthy, quiet=True)
        return self._judge(verdict, "gate --run")

    def assert_no_regression(self, target: str | Path | None = None, *, baseline: str | Path,
                             max_slowdown_pct: float | None = None, variant: str = "optimized",
                             trainer: str | None = None, config: dict[str, Any] | None = None,
                             steps: int | None = None, repeats: int | None = None, sets: tuple[str, ...] = (),
                             allow_untrustworthy: bool = False) -> GateVerdict:
        """Measure ``variant`` now and gate it against the saved result ``baseline`` (``rlgauge run
        --out`` then ``rlgauge gate --baseline --candidate``): no slowdown beyond ``max_slowdown_pct``."""
        from harness.integrations.gate_api import gate

        candidate = self.workdir / "rlgauge-candidate.json"
        argv: list[Any] = ["run", self.target(target, trainer=trainer, config=config), "--variant", variant,
                           "--out", candidate, "--quiet"]
        for option, value in (("--steps", steps), ("--repeats", repeats)):
            if value is not None:
                argv += [option, value]
        for text in sets:
            argv += ["--set", text]
        measured = self.command(*argv)
        if measured.code == 130:
            raise KeyboardInterrupt
        if measured.code != 0:
            pytest.fail(f"rlgauge run exited {measured.code}:\n{measured.text}", pytrace=False)
        verdict = gate(baseline=baseline, candidate=candidate, max_slowdown_pct=max_slowdown_pct,
                       allow_untrustworthy=allow_untrustworthy)
        return self._judge(verdict, "gate")

    def _judge(self, verdict: GateVerdict, what: str) -> GateVerdict:
        """The gate's typed outcome as a test outcome: pass, fail, skip on no verdict (listed in the summary),
        fail on bad input, KeyboardInterrupt when interrupted."""
        from harness.analyses.gate_outcome import Outcome

        if verdict.outcome is Outcome.PASS:
            return verdict
        if verdict.outcome is Outcome.INTERRUPTED:
            raise KeyboardInterrupt
        if verdict.outcome is Outcome.NO_VERDICT:
            reason = verdict.reason or _last_line(verdict.output)
            self.no_verdicts.append((self.test_id, reason))
            pytest.skip(f"rlgauge {what}: no verdict on this machine: {reason}")
        detail = f" ({verdict.outcome.value}: {verdict.reason})" if verdict.reason else f" ({verdict.outcome.value})"
        pytest.fail(f"rlgauge {what} exited {verdict.exit_code}{detail}:\n{verdict.output.strip()}", pytrace=False)
        raise AssertionError  # unreachable: pytest.fail raises


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].removeprefix("rlgauge: ") if lines else ""


@pytest.fixture
def rlgauge(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[RlgaugeGate]:
    """Gate assertions on training speed: ``assert_speedup`` and ``assert_no_regression``."""
    no_verdicts = request.config.stash.setdefault(_NO_VERDICTS, [])
    yield RlgaugeGate(tmp_path, no_verdicts, request.node.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Speed gates that could not decide are named in the summary, so CI sees them beside the skips."""
    no_verdicts = terminalreporter.config.stash.get(_NO_VERDICTS, [])
    if not no_verdicts:
        return
    terminalreporter.section("rlgauge: speed gates without a verdict")
    for test_id, reason in no_verdicts:
        terminalreporter.write_line(f"NO VERDICT {test_id}: {reason}")
    terminalreporter.write_line(f"{len(no_verdicts)} speed gate{'s' * (len(no_verdicts) != 1)} gave no verdict "
                                "(skipped): measure on a quieter machine or with more repeats")
