"""Campaign executors: local and Ray run the same jobs to the same results, keep what finished, refuse bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY

from harness.campaigns.executors import LocalExecutor, parse_executor
from harness.campaigns.jobs import Job
from harness.cli import main
from harness.errors import UserError

TINY_SETS = [a for item in TINY for a in ("--set", item)]
REPO_ROOT = Path(__file__).resolve().parent.parent


def _square(x: int) -> int:
    return x * x


def _interrupt(x: int) -> int:
    raise KeyboardInterrupt


def test_local_executor_keeps_the_jobs_that_finished_when_interrupted() -> None:
    jobs = [Job("a", _square, (2,)), Job("b", _square, (3,)), Job("c", _interrupt, (0,)), Job("d", _square, (4,))]
    seen: list[str] = []
    gathered = LocalExecutor().run(jobs, on_result=lambda job, _r: seen.append(job.name))
    assert gathered.interrupted and gathered.results == {"a": 4, "b": 9} and seen == ["a", "b"]
    assert gathered.in_order(jobs) == [4, 9] and set(gathered.hosts) == {"a", "b"}


@pytest.mark.parametrize("text, message", [
    ("dask", "--executor dask: unknown executor; accepted: local | ray | ray:ADDRESS"),
    ("ray:", "--executor ray:: unknown executor"),
    ("ray:host:notaport", "not an address; accepted: ray:HOST:PORT"),
])
def test_an_unknown_executor_or_address_is_refused(text: str, message: str) -> None:
    pytest.importorskip("ray")
    with pytest.raises(UserError, match=message.replace("|", r"\|").replace("(", r"\(")):
        parse_executor(text)


def test_without_ray_installed_the_ray_executor_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(UserError, match=r"Ray is not installed; install the extra: pip install 'rlgauge\[ray\]'"):
        parse_executor("ray")


def test_a_ray_address_that_does_not_answer_is_exit_2_within_the_timeout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")
    import harness.campaigns.ray_executor as ray_executor

    monkeypatch.setattr(ray_executor, "CONNECT_TIMEOUT_S", 1.0)
    started = time.monotonic()
    # port 9 (discard) on this machine: nothing listens there
    code = main(["learn", "ppo-cartpole", "--seeds", "2", "--steps", "1000", *TINY_SETS, "--quiet",
                 "--executor", "ray:127.0.0.1:9", "--out", str(tmp_path / "learn")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "no Ray head answered at 127.0.0.1:9 within 1 s" in err and time.monotonic() - started < 60


def _curves(out: Path) -> dict:
    data = json.loads((out / "learn.json").read_text())
    return {(task, arm, c["seed"]): (c["env_steps"], c["points"]) for task, by_arm in data["curves"].items()
            for arm, entries in by_arm.items() for c in entries}


@pytest.mark.slow  # two campaigns of 30,000 env steps a seed: a difference shows only after many updates
def test_a_seeds_curves_do_not_depend_on_the_seeds_run_before_it(tmp_path: Path) -> None:
    """Seed 302 run second (after 301) and run first: the same curves. In one process the first job's thread
    settings changed the second's float paths (docs/analysis.md); each job now has a process of its own."""
    argv = ["learn", "ppo-cartpole-sb3", "--seeds", "2", "--steps", "30000", "--device", "cpu", "--quiet"]
    main([*argv, "--seed", "301", "--out", str(tmp_path / "second")])
    main([*argv, "--seed", "302", "--out", str(tmp_path / "first")])
    second, first = _curves(tmp_path / "second"), _curves(tmp_path / "first")
    for arm in ("baseline", "optimized"):
        assert second[("ppo-cartpole-sb3", arm, 302)] == first[("ppo-cartpole-sb3", arm, 302)], arm


@pytest.mark.slow  # starting a local Ray takes tens of seconds on a small machine
def test_learn_on_a_local_ray_equals_the_local_executor(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    argv = ["learn", "ppo-cartpole", "--seeds", "2", "--steps", "1000", *TINY_SETS, "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "local")]) == 0
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert main([*argv, "--executor", "ray", "--out", str(tmp_path / "ray")]) == 0
    finally:
        ray.shutdown()
    local, remote = _curves(tmp_path / "local"), _curves(tmp_path / "ray")
    assert set(local) == {("ppo-cartpole", arm, seed) for arm in ("baseline", "optimized") for seed in (1, 2)}
    assert remote == local
    assert json.loads((tmp_path / "ray" / "learn.json").read_text())["campaign"]["executor"] == "ray (local)"


def test_learn_runs_every_job_on_one_thread_count_whatever_the_default(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread count splits float sums differently, so curves would follow the executor or the load: a
    trainer whose torch_threads is unset learns on LEARN_THREADS, not on the process default (here 2)."""
    from reference_trainers.runtime import device as dev

    from harness.analyses.learn import LEARN_THREADS

    monkeypatch.setattr(dev, "DEFAULT_THREADS", 2)
    monkeypatch.setattr(dev, "_default_threads", 2)
    assert main(["learn", "ppo-cartpole", "--seeds", "2", "--steps", "1000", *TINY_SETS, "--quiet",
                 "--set", "optimizations.torch_threads=null", "--out", str(tmp_path)]) == 0
    threads = json.loads((tmp_path / "learn.json").read_text())["machine_state"]["threads"]
    assert threads["by_arm"] == {"baseline": LEARN_THREADS, "optimized": LEARN_THREADS}
    assert dev.default_threads() == 2  # the process's own default is back once the campaign ends


class _Recording(LocalExecutor):
    """Runs jobs here, as the local executor does, and records their names (a stand-in for a cluster)."""

    name = "recording"

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[str] = []

    def run(self, jobs, *, cpus_per_job=1, on_result=None):  # noqa: ANN001, ANN201 - the executor protocol
        self.jobs += [job.name for job in jobs]
        return super().run(jobs, cpus_per_job=cpus_per_job, on_result=on_result)


def test_matrix_sends_one_job_per_preset_to_its_executor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.cli.analysis_commands as commands

    executor = _Recording()
    monkeypatch.setattr(commands, "parse_executor", lambda text, **_options: executor)
    code = main(["matrix", "--presets", "ppo-cartpole,ppo-acrobot", *TINY_SETS, "--quiet", "--executor", "x",
                 "--out", str(tmp_path / "m")])
    runs = json.loads((tmp_path / "m" / "runs.json").read_text())["runs"]
    assert code == 0 and executor.jobs == ["ppo-cartpole", "ppo-acrobot"]
    assert [(r["preset"], r["variant"]) for r in runs] == [(p, v) for p in ("ppo-cartpole", "ppo-acrobot")
                                                           for v in ("baseline", "optimized")]


def test_learn_sends_one_job_per_task_and_seed_to_its_executor(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.cli.analysis_commands as commands

    executor = _Recording()
    monkeypatch.setattr(commands, "parse_executor", lambda text, **_options: executor)
    out = tmp_path / "learn"
    assert main(["learn", "ppo-cartpole,ppo-acrobot", "--seeds", "2", "--steps", "1000", *TINY_SETS,
                 "--set", "env.kwargs.max_episode_steps=200", "--quiet", "--executor", "x", "--out", str(out)]) == 0
    assert executor.jobs == [f"{task} seed {seed}" for task in ("ppo-cartpole", "ppo-acrobot") for seed in (1, 2)]
    data = json.loads((out / "learn.json").read_text())
    assert data["tasks"] == ["ppo-cartpole", "ppo-acrobot"]
    assert {row["task"] for row in data["verdicts"]} == {"ppo-cartpole", "ppo-acrobot", "all tasks"}


class _FakeRay:
    """Enough of Ray's API to drive ``RayExecutor``: tasks run when waited on; the second wait is a Ctrl-C."""

    class exceptions:  # noqa: N801 - mirrors ray.exceptions
        class RayTaskError(Exception):
            def __init__(self, cause: BaseException) -> None:
                super().__init__(str(cause))
                self.cause = cause

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.resources: list[dict] = []
        self.cancelled: list[object] = []
        self.waits, self.interrupt_at = 0, interrupt_at
        self.started = self.stopped = False

    def is_initialized(self) -> bool:
        return self.started

    def init(self, **kwargs: object) -> None:
        self.started = True

    def shutdown(self) -> None:
        self.stopped = True

    def remote(self, **resources: object):  # noqa: ANN201
        self.resources.append(resources)

        class _Task:
            @staticmethod
            def remote(fn, cpus, *args):  # noqa: ANN001, ANN205
                return ("ref", fn, cpus, args)

        return lambda body: _Task

    def wait(self, refs: list, num_returns: int = 1) -> tuple[list, list]:
        self.waits += 1
        if self.interrupt_at is not None and self.waits >= self.interrupt_at:
            raise KeyboardInterrupt
        return refs[:1], refs[1:]

    def get(self, ref: tuple):  # noqa: ANN201
        _, fn, cpus, args = ref
        try:
            return fn(*args), f"node-{cpus}"
        except Exception as exc:  # noqa: BLE001 - as a remote task's failure reaches the driver
            raise self.exceptions.RayTaskError(exc) from None

    def cancel(self, ref: object, force: bool = False) -> None:
        self.cancelled.append(ref)


def _ray_executor(monkeypatch: pytest.MonkeyPatch, fake: _FakeRay):  # noqa: ANN202
    monkeypatch.setitem(sys.modules, "ray", fake)
    return parse_executor("ray")


def test_ray_tasks_hold_the_cpus_asked_for_and_keep_what_finished_on_ctrl_c(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeRay(interrupt_at=3)
    executor = _ray_executor(monkeypatch, fake)
    jobs = [Job(name, _square, (i,)) for i, name in enumerate("abcd")]
    gathered = executor.run(jobs, cpus_per_job=3)
    assert fake.resources == [{"num_cpus": 3, "max_retries": 0}]
    assert gathered.interrupted and gathered.results == {"a": 0, "b": 1} and gathered.hosts["a"] == "node-3"
    assert len(fake.cancelled) == 2 and fake.stopped  # the two tasks still running, then Ray shut down


def test_fresh_process_ray_tasks_each_get_a_worker_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    gathered = parse_executor("ray", fresh_processes=True).run([Job("a", _square, (3,))], cpus_per_job=1)
    assert fake.resources == [{"num_cpus": 1, "max_retries": 0, "max_calls": 1}] and gathered.results == {"a": 9}


def _pid_and_square(x: int) -> tuple[int, int]:
    return os.getpid(), x * x


def _raise_user_error(_x: int) -> int:
    raise UserError("bad input in a fresh process")


def test_fresh_processes_run_each_job_in_a_process_of_its_own_and_raise_its_errors() -> None:
    executor = LocalExecutor(fresh_processes=True)
    gathered = executor.run([Job("a", _pid_and_square, (2,)), Job("b", _pid_and_square, (3,))])
    (pid_a, four), (pid_b, nine) = gathered.in_order([Job("a", _square), Job("b", _square)])
    assert (four, nine) == (4, 9) and len({pid_a, pid_b, os.getpid()}) == 3
    with pytest.raises(UserError, match="bad input in a fresh process"):
        executor.run([Job("c", _raise_user_error, (1,))])


INTERRUPTED_CAMPAIGN = """
import os, signal, threading, time
from harness.campaigns.executors import LocalExecutor
from harness.campaigns.jobs import Job

def fill(sink):
    for i in range(3000):
        sink.append(i)
        if i == 5:
            open(os.environ["READY"], "w").close()
        time.sleep(0.01)
    return sink

def interrupt_when_ready():
    while not os.path.exists(os.environ["READY"]):
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)

signal.signal(signal.SIGINT, signal.default_int_handler)  # live even where the caller ignores SIGINT (a `&` job)
threading.Thread(target=interrupt_when_ready, daemon=True).start()
jobs = [Job("first", fill, ([],), keeps=0), Job("second", fill, ([],), keeps=0)]
gathered = LocalExecutor(fresh_processes=True).run(jobs)
print(gathered.interrupted, sorted(gathered.results), len(gathered.results["first"]) >= 6)
"""


def test_ctrl_c_stops_a_fresh_process_job_and_keeps_what_it_had_filled(tmp_path: Path) -> None:
    env = {**os.environ, "READY": str(tmp_path / "ready"), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_CAMPAIGN], capture_output=True, text=True, env=env,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "['first']", "True"], proc.stdout + proc.stderr


def test_a_jobs_own_error_reaches_the_command_as_a_local_run_raises_it(monkeypatch: pytest.MonkeyPatch) -> None:
    executor = _ray_executor(monkeypatch, _FakeRay())

    def bad(_x: int) -> int:
        raise UserError("bad input in a task")

    with pytest.raises(UserError, match="bad input in a task"):
        executor.run([Job("a", bad, (1,))], cpus_per_job=1)
