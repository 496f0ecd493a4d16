"""The parent's side of an arm: what to run (the runtime changes and the folder of patched copies) and running
it in a fresh process (``child``), its output kept in a log beside the request: once (``ArmRunner.run``), or
kept alive to train slice after slice on request (``ArmRunner.serve``)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness

HARNESS_ROOT = str(Path(harness.__file__).resolve().parents[1])
DEFAULT_TIMEOUT_S = 600.0
"""The longest an arm's process may go without progress (``--timeout``): a finished ``iterate()`` call, a step of
its start (imports, the trainer built) or an answer; longer, and it is taken for hung."""
POLL_S = 0.25


@dataclass(frozen=True)
class Target:
    """The trainer every arm builds: a YAML file (``target``) or ``trainer`` with ``config``, and the variant."""

    target: str | None
    trainer: str | None
    config: str | None
    variant: str
    overrides: list[str]
    sys_path: list[str]
    """The parent's import folders (the user's module is found as it was for the diagnosis)."""
    fair_threads: bool = True
    """The trainer's ``run.fair_threads``: cap torch's default thread count in every arm as ``rlgauge run`` does."""
    threads_cap: int | None = None
    """That cap: the cores other processes left free when the try began on the machine it runs on (``session``
    decides it once, before any arm of its own runs); None: torch's default."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """The longest an arm's process may go without progress; past it the process is stopped and the arm fails."""


@dataclass
class Arm:
    name: str
    changes: tuple[str, ...] = ()
    """Every change the arm applies (runtime and source)."""
    runtime: tuple[str, ...] = ()
    patched_dir: Path | None = None
    edited: dict[Path, tuple[str, str]] = field(default_factory=dict)
    """The user's files it edits: path -> (original text, edited text)."""


class ArmRunner:
    """Runs arms in fresh processes, each request, answer and log in ``workdir``."""

    def __init__(self, target: Target, workdir: Path, forked: bool = True) -> None:
        self.target, self.workdir = target, workdir
        self.count = 0
        self._lock = threading.Lock()
        self.forked = forked
        """Arm processes forked from a warm zygote (``zygote``); False, or where it cannot start: plain ones."""
        self._zygote: Any = None

    def _warm(self) -> Any:
        """The zygote, started on first use; None where arms start as plain processes."""
        if self.forked and self._zygote is None:
            from harness.trials.processes.zygote import Zygote

            try:
                self._zygote = Zygote(_child_env())
            except OSError:
                self._zygote = False
        return self._zygote or None

    def launch(self, request: Path, sink: Any, pipes: bool) -> Any:
        """The arm's process for ``request``: forked by the zygote, or a plain one. With ``pipes`` its stdin and
        stdout are text pipes to the parent and its stderr goes to ``sink``; without, both outputs go there."""
        zygote = self._warm()
        if zygote is not None:
            try:
                return _forked(zygote, [str(request)], sink, pipes)
            except OSError:
                pass
        if pipes:
            return subprocess.Popen(child_command(request), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=sink, env=_child_env(), text=True, bufsize=1)
        return subprocess.Popen(child_command(request), stdout=sink, stderr=subprocess.STDOUT, env=_child_env())

    def close(self) -> None:
        """The zygote ended (its arm processes are ended by their owners)."""
        if self._zygote:
            self._zygote.close()
        self._zygote = None

    def _request(self, arm: Arm, mode: str, iterations: int = 0,
                 checks: bool = True) -> tuple[Path, Path, Path, dict[str, Any]]:
        with self._lock:  # parity runs are started from several threads
            self.count += 1
            stem = self.workdir / f"{self.count:03d}-{arm.name}-{mode}"
        out, log = stem.with_suffix(".answer.json"), stem.with_suffix(".log")
        request = {"mode": mode, "target": self.target.target, "trainer": self.target.trainer,
                   "config": self.target.config, "variant": self.target.variant,
                   "overrides": self.target.overrides, "sys_path": self.target.sys_path,
                   "changes": list(arm.runtime), "patched_dir": str(arm.patched_dir) if arm.patched_dir else None,
                   "threads_cap": self.target.threads_cap,
                   "iterations": iterations, "checks": checks, "params_out": str(stem.with_suffix(".pt")), "out": str(out),
                   "heartbeat": str(stem.with_suffix(".alive"))}
        path = stem.with_suffix(".request.json")
        path.write_text(json.dumps(request), encoding="utf-8")
        return path, out, log, request

    def width(self) -> int:
        """How many of its processes may start side by side: the usable cores over each one's threads. Two
        processes whose threads together outnumber the cores spin against each other and take several times as
        long as one after the other."""
        return starting_width(self.target.threads_cap)

    def run(self, arm: Arm, mode: str, iterations: int = 0) -> dict[str, Any]:
        """The child's answer: ``{"parity", "params"}`` or ``{"error"}`` (one line), with its ``log``."""
        path, out, log, request = self._request(arm, mode, iterations)
        with open(log, "wb") as sink:
            process = self.launch(path, sink, pipes=False)
            silence = Silence(Path(request["heartbeat"]), self.target.timeout_s)
            try:
                code = _wait(process, silence)
            except KeyboardInterrupt:  # the child got the same Ctrl-C: a moment to end, then stopped
                stop(process, grace_s=0.25)
                raise
            if code is None:
                stop(process)
                return {"error": timed_out(self.target.timeout_s), "params": request["params_out"], "log": str(log)}
        if code == 130 or code == -2:
            raise KeyboardInterrupt
        try:
            answer = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            answer = {"error": _last_line(log) or f"the arm's process ended with exit code {code}"}
        answer["params"] = request["params_out"]
        answer["log"] = str(log)
        return answer

    def serve(self, arm: Arm, checks: bool = True, parity_iterations: int = 0) -> ServedArm:
        """The arm's process started: it builds the trainer (with ``parity_iterations``, first checks its maths
        over that many calls: the ready answer carries ``parity`` and ``params`` as ``run``'s does), warms it up
        and runs the checks (unless ``checks`` is False) while the parent goes on."""
        path, _out, log, request = self._request(arm, "serve", parity_iterations, checks=checks)
        if parity_iterations:
            request["parity"] = True
            path.write_text(json.dumps(request), encoding="utf-8")
        return ServedArm(child_command(path), log, Silence(Path(request["heartbeat"]), self.target.timeout_s),
                         request["params_out"] if parity_iterations else None,
                         launch=lambda sink: self.launch(path, sink, pipes=True))


def _forked(zygote: Any, argv: list[str], sink: Any, pipes: bool) -> Any:
    """An arm process forked by ``zygote`` (``launch``'s streams)."""
    if not pipes:
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            return zygote.spawn(argv, devnull, sink.fileno(), sink.fileno())
        finally:
            os.close(devnull)
    their_stdin, our_stdin = os.pipe()
    our_stdout, their_stdout = os.pipe()
    try:
        process = zygote.spawn(argv, their_stdin, their_stdout, sink.fileno())
    except OSError:
        os.close(our_stdin)
        os.close(our_stdout)
        raise
    finally:
        os.close(their_stdin)
        os.close(their_stdout)
    process.stdin = open(our_stdin, "w", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed with the process
    process.stdout = open(our_stdout, encoding="utf-8")  # noqa: SIM115
    return process


def starting_width(threads_cap: int | None) -> int:
    """``ArmRunner.width`` for arms capped at ``threads_cap`` threads (None: torch's default, every usable core)."""
    from harness.measurement.machine_state import usable_cores

    cores = usable_cores()
    return max(1, cores // max(1, threads_cap or cores))


def child_command(request: Path) -> list[str]:
    return [sys.executable, "-m", "harness.trials.processes.child", str(request)]


def timed_out(seconds: float) -> str:
    return f"timed out: no progress for {seconds:g} s (--timeout); the arm's process was stopped"


class Silence:
    """How long an arm's process has shown no progress: since it started or was last asked (``reset``), or since
    its heartbeat file (``child.Heartbeat``) was last touched, whichever is later."""

    def __init__(self, heartbeat: Path | None, limit_s: float) -> None:
        self.heartbeat, self.limit_s = heartbeat, limit_s
        self.reset()

    def reset(self) -> None:
        self._since = time.time()

    def exceeded(self) -> bool:
        last = self._since
        if self.heartbeat is not None:
            with contextlib.suppress(OSError):
                last = max(last, self.heartbeat.stat().st_mtime)
        return time.time() - last > self.limit_s


def _wait(process: subprocess.Popen, silence: Silence) -> int | None:
    """The process's exit code, or None once it has been silent too long."""
    while True:
        try:
            return process.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            if silence.exceeded():
                return None


def stop(process: subprocess.Popen, grace_s: float = 0.0) -> None:
    """``process`` and every process it started (an async vector env's workers) ended, after ``grace_s``."""
    import psutil

    if grace_s:
        try:
            process.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            pass
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    with contextlib.suppress(OSError):
        process.kill()
    process.wait()


class ServedArm:
    """One arm's live process: ``ready()`` once its warm-up and checks are done, then ``slice(env_steps)`` as often
    as asked (each answer ``{"env_steps", "wall", "cpu"}`` or ``{"error"}``); ``close()`` ends it. Requests and
    answers are JSON lines on the process's stdin and stdout; whatever the trainer prints goes to the log. A process
    silent for longer than its ``silence`` allows is stopped: the arm fails with one line."""

    def __init__(self, command: list[str], log: Path, silence: Silence, params: str | None = None,
                 launch: Any = None) -> None:
        self.log, self.silence, self.params = log, silence, params
        self._sink = open(log, "wb")  # noqa: SIM115 - closed with the process
        if launch is not None:
            self.process = launch(self._sink)
        else:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._sink,
                                            env=_child_env(), text=True, bufsize=1)
        self.failed: str | None = None
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        """The process's answers, line by line, into a queue (``""``: its stdout closed)."""
        try:
            for line in self.process.stdout:  # type: ignore[union-attr]
                self._lines.put(line)
        except (OSError, ValueError):
            pass
        self._lines.put("")

    def _answer(self, wait_s: float | None = None) -> dict[str, Any] | None:
        """The next answer; with ``wait_s``, None when none came within that long."""
        if self.failed is not None:
            return {"error": self.failed}
        line = None
        waited = 0.0
        while line is None:
            try:
                line = self._lines.get(timeout=POLL_S if wait_s is None else min(POLL_S, wait_s))
            except queue.Empty:
                if self.silence.exceeded():
                    stop(self.process)
                    self.failed = timed_out(self.silence.limit_s)
                    return {"error": self.failed}
                waited += POLL_S if wait_s is None else min(POLL_S, wait_s)
                if wait_s is not None and waited >= wait_s:
                    return None
        if not line:
            code = self.process.wait()
            if code in (130, -2):
                raise KeyboardInterrupt
            self.failed = _last_line(self.log) or f"the arm's process ended with exit code {code}"
            return {"error": self.failed}
        answer = json.loads(line)
        if "error" in answer:
            self.failed = answer["error"]
        return answer

    def ready(self) -> dict[str, Any]:
        return self._with_params(self._answer())  # type: ignore[arg-type]

    def ready_within(self, seconds: float) -> dict[str, Any] | None:
        """The ready answer if it comes within ``seconds``, else None (asked again later)."""
        answer = self._answer(seconds)
        return None if answer is None else self._with_params(answer)

    def _with_params(self, answer: dict[str, Any]) -> dict[str, Any]:
        """A ready answer with its maths check's saved state and the log, as ``ArmRunner.run`` answers."""
        if "parity" in answer and self.params:
            answer = {**answer, "params": self.params, "log": str(self.log)}
        return answer

    def slice(self, env_steps: int) -> dict[str, Any]:
        if self.failed is None:
            self.silence.reset()
            try:
                self.process.stdin.write(json.dumps({"env_steps": env_steps}) + "\n")  # type: ignore[union-attr]
                self.process.stdin.flush()  # type: ignore[union-attr]
            except (BrokenPipeError, OSError):
                pass  # the process ended: its answer says why
        return self._answer()  # type: ignore[return-value]

    def end_requests(self) -> None:
        """End of requests: the child closes its trainer and exits (``close`` waits for it)."""
        with contextlib.suppress(OSError, ValueError):
            if self.process.poll() is None and self.process.stdin and not self.process.stdin.closed:
                self.process.stdin.close()

    def close(self) -> None:
        try:
            self.end_requests()
            self.process.wait(timeout=30)
            if self.process.stdout is not None:
                with contextlib.suppress(OSError, ValueError):
                    self.process.stdout.close()
        except (subprocess.TimeoutExpired, OSError):
            stop(self.process)
        finally:
            self._sink.close()


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (HARNESS_ROOT, os.environ.get("PYTHONPATH")) if p)}


def _last_line(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return ""
    return next((line for line in reversed(lines) if line), "")
