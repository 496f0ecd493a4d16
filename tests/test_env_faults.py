"""Faults in async env workers: a sub-env that raises or a worker that is killed gives one clear line
naming the env id and sub-env, the other workers are stopped, and no process is left behind."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

import faulty_envs  # noqa: F401 - registers FailingCartPole-v0
from harness.cli import main
from reference_trainers.ppo import trainer as ppo_module
from reference_trainers.envs.async_backend import EnvWorkerError
from reference_trainers.envs.factory import make_vector_env

ASYNC_RUN = ["run", "ppo-cartpole", "--variant", "optimized", "--quiet", "--set", "device=cpu",
             "--set", "env.vectorization=async", "--set", "env.num_envs=3", "--set", "ppo.num_steps=16",
             "--set", "run.warmup_steps=0", "--set", "run.steps=480", "--set", "run.repeats=1"]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_sub_env_raising_in_step_fails_the_run_with_one_line_naming_env_and_index(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, before = tmp_path / "r.json", _children()
    code, stdout, err = _run(capsys, *ASYNC_RUN, "--set", "env.id=faulty_envs:FailingCartPole-v0",
                             "--set", "env.kwargs.fail_at_step=30", "--set", "env.kwargs.fail_seed=2", "--out", str(out))
    assert code == 1
    expected = ("env 'faulty_envs:FailingCartPole-v0' sub-env 1 raised ValueError: "
                "planted failure at step 30 second line")
    assert f"rlgauge: optimized run is failed: EnvWorkerError: {expected}" in err.splitlines()
    assert "Traceback" not in stdout + err
    (run,) = json.loads(out.read_text(encoding="utf-8"))["runs"]
    assert run["status"] == "failed" and run["error"] == f"EnvWorkerError: {expected}"
    assert _children() <= before


def test_a_killed_worker_fails_the_run_naming_the_sub_env_and_the_signal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    original, calls, killed = ppo_module.PPOTrainer.iterate, {"n": 0}, []

    def iterate(self: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            killed.append(self.envs.processes[2].pid)
            os.kill(killed[0], signal.SIGKILL)
        return original(self)

    monkeypatch.setattr(ppo_module.PPOTrainer, "iterate", iterate)
    out, before = tmp_path / "r.json", _children()
    code, stdout, err = _run(capsys, *ASYNC_RUN, "--out", str(out))
    assert code == 1
    message = f"env 'CartPole-v1' sub-env 2 failed during step: its worker process (pid {killed[0]}) was killed by SIGKILL"
    assert f"rlgauge: optimized run is failed: EnvWorkerError: {message}" in err.splitlines()
    assert "Traceback" not in stdout + err
    (run,) = json.loads(out.read_text(encoding="utf-8"))["runs"]
    assert run["status"] == "failed" and "sub-env 2" in run["error"]
    assert _children() <= before


def test_a_failed_sub_env_stops_every_other_worker_at_once() -> None:
    envs = make_vector_env("faulty_envs:FailingCartPole-v0", 3, "async", env_kwargs={"fail_at_step": 2, "fail_seed": 0})
    envs.reset(seed=0)
    workers = list(envs.processes)
    envs.step(envs.action_space.sample())
    with pytest.raises(EnvWorkerError, match=r"sub-env 0 raised ValueError: planted failure at step 2 second line$"):
        envs.step(envs.action_space.sample())
    assert [w.is_alive() for w in workers] == [False, False, False]
    assert envs.closed
    envs.close()  # a no-op now


def test_a_worker_killed_between_steps_is_reported_on_the_next_step() -> None:
    envs = make_vector_env("CartPole-v1", 2, "async")
    envs.reset(seed=0)
    victim = envs.processes[1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=10)
    with pytest.raises(EnvWorkerError, match="sub-env 1 failed during step: .*killed by SIGKILL"):
        envs.step(envs.action_space.sample())
    assert not any(p.is_alive() for p in envs.processes)


def test_close_while_a_step_is_in_flight_collects_it_and_stops_the_workers() -> None:
    envs = make_vector_env("CartPole-v1", 2, "async")
    envs.reset(seed=0)
    envs.step_async(envs.action_space.sample())  # as when Ctrl-C lands inside step()
    envs.close()
    assert envs.closed and not any(p.is_alive() for p in envs.processes)
    assert all(p.exitcode == 0 for p in envs.processes)  # finished on request, not terminated


def test_close_after_a_step_sent_to_only_some_workers_prints_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C inside ``step_async`` between two sends: one worker steps while the env thinks it is idle.
    Closing must let that worker answer ``close`` before the pipes shut (no BrokenPipeError traceback)."""
    envs = make_vector_env("CartPole-v1", 2, "async")
    envs.reset(seed=0)
    capfd.readouterr()
    envs.parent_pipes[-1].send(("step", envs.single_action_space.sample()))  # step_async, interrupted
    envs.close()
    assert envs.closed and not any(p.is_alive() for p in envs.processes)
    assert all(p.exitcode == 0 for p in envs.processes)
    assert "Traceback" not in capfd.readouterr().err


def test_workers_ignore_sigint_so_ctrl_c_is_handled_by_the_main_process_alone() -> None:
    main_handler = signal.getsignal(signal.SIGINT)
    envs = make_vector_env("CartPole-v1", 2, "async")
    try:
        envs.reset(seed=0)
        for process in envs.processes:
            os.kill(process.pid, signal.SIGINT)
        envs.step(envs.action_space.sample())  # still stepping: no worker took the signal
        assert all(p.is_alive() for p in envs.processes)
    finally:
        envs.close()
    assert signal.getsignal(signal.SIGINT) is main_handler  # the main process keeps its Ctrl-C handling
