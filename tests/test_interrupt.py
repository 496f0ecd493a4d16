"""Interruption: Ctrl-C or SIGTERM during a real ``rlgauge run`` with async env workers ends in exit
code 130, an ``interrupted`` result file written atomically, and no process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.measurement import interrupts
from harness.measurement.interrupts import deferred_interrupts, raise_if_stopping, stop_on_signals

REPO_ROOT = Path(__file__).resolve().parents[1]
NUM_ENVS = 2
LONG_RUN = ["--variant", "optimized", "--set", "device=cpu", "--set", "env.vectorization=async",
            "--set", f"env.num_envs={NUM_ENVS}", "--set", "ppo.num_steps=32", "--set", "run.warmup_steps=0",
            "--set", "run.steps=100000000", "--set", "run.repeats=1"]


def _start_run(out: Path) -> subprocess.Popen[str]:
    """``python -m harness run`` in its own session (so a signal can go to its whole process group)."""
    return subprocess.Popen([sys.executable, "-m", "harness", "run", "ppo-cartpole", *LONG_RUN, "--out", str(out)],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"}, start_new_session=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal)


def _ctrl_c_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT at its default even if this test process ignores it (nohup, ``&``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_workers(proc: subprocess.Popen[str], count: int, timeout: float = 90) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        children = psutil.Process(proc.pid).children(recursive=True)
        if len(children) >= count:
            return [c.pid for c in children]
        time.sleep(0.1)
    raise AssertionError("the env workers never started")


def _wait_for_worker_cpu(pids: list[int], seconds: float, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids) < seconds:
        assert time.monotonic() < deadline, "the env workers never got busy"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize(("sig", "to_group"), [(signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["ctrl-c-to-the-process-group", "sigterm-to-the-main-process"])
def test_a_signal_mid_run_exits_130_with_an_interrupted_result_and_no_process_left(
        sig: signal.Signals, to_group: bool, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = _start_run(out)
    try:
        workers = _wait_for_workers(proc, NUM_ENVS)
        _wait_for_worker_cpu(workers, seconds=0.5)  # thousands of env steps: well into the timed loop
        if to_group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stdout + stderr
    assert f"interrupted by {sig.name}" in stderr
    (run,) = json.loads(out.read_text(encoding="utf-8"))["runs"]
    assert run["status"] == "interrupted" and run["stability"]["passed"] is False
    assert run["steps_completed"] > 0
    assert [pid for pid in workers if _alive(pid)] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]  # no temporary left behind


def test_stop_on_signals_turns_the_first_sigterm_into_keyboard_interrupt_and_restores_handlers() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        with stop_on_signals() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs at the next bytecode; never reached
    assert stop.received == ["SIGTERM"]
    assert {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == before


def test_signals_after_hold_are_noted_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    with stop_on_signals() as stop:
        stop.hold()
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10):
                time.sleep(0.01)
    assert stop.received == ["SIGTERM", "SIGTERM"]
    assert "SIGTERM ignored" in capsys.readouterr().err


def test_nested_blocks_restore_the_outer_handlers() -> None:
    with stop_on_signals() as outer:
        outer_handler = signal.getsignal(signal.SIGTERM)
        with stop_on_signals() as inner:
            inner.hold()
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10):
                time.sleep(0.01)
        assert signal.getsignal(signal.SIGTERM) == outer_handler
        assert inner.received == ["SIGTERM"] and outer.received == []


def test_a_signal_ignored_on_purpose_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stop_on_signals() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10):
                time.sleep(0.01)
        assert stop.received == [] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_inside_a_measuring_loop_a_signal_waits_for_the_next_check() -> None:
    """An exception raised asynchronously mid-library-call can leave a lock held or a pipe half read: in the
    loop the signal is noted, and the loop stops at its next raise_if_stopping()."""
    reached: list[str] = []
    with stop_on_signals() as stop:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            with deferred_interrupts():
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(20):
                    time.sleep(0.01)  # an iteration's work: not cut short
                reached.append("end of the iteration")
                raise_if_stopping()
                reached.append("the next iteration")
    assert reached == ["end of the iteration"] and stop.received == ["SIGTERM"]


def test_a_pending_signal_is_raised_when_the_loop_ends_without_another_check() -> None:
    with stop_on_signals():
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            with deferred_interrupts():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)


def test_an_iteration_that_never_checks_is_interrupted_after_the_grace_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interrupts, "ESCALATE_AFTER_S", 0.2)
    started = time.monotonic()
    with stop_on_signals() as stop:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            with deferred_interrupts():
                os.kill(os.getpid(), signal.SIGTERM)
                while time.monotonic() - started < 30:  # a long iterate() of one's own trainer
                    time.sleep(0.01)
    assert time.monotonic() - started < 10 and stop.received == ["SIGTERM"]
