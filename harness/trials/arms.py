"""The parent's side of an arm: what to run (the runtime changes and the folder of patched copies) and running
it in a fresh process (``child``), its output kept in a log beside the request: once (``ArmRunner.run``), or
kept alive to train slice after slice on request (``ArmRunner.serve``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness

HARNESS_ROOT = str(Path(harness.__file__).resolve().parents[1])


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

    def __init__(self, target: Target, workdir: Path) -> None:
        self.target, self.workdir = target, workdir
        self.count = 0

    def _request(self, arm: Arm, mode: str, iterations: int = 0) -> tuple[Path, Path, Path, dict[str, Any]]:
        self.count += 1
        stem = self.workdir / f"{self.count:03d}-{arm.name}-{mode}"
        out, log = stem.with_suffix(".answer.json"), stem.with_suffix(".log")
        request = {"mode": mode, "target": self.target.target, "trainer": self.target.trainer,
                   "config": self.target.config, "variant": self.target.variant,
                   "overrides": self.target.overrides, "sys_path": self.target.sys_path,
                   "changes": list(arm.runtime), "patched_dir": str(arm.patched_dir) if arm.patched_dir else None,
                   "threads_cap": self.target.threads_cap,
                   "iterations": iterations, "params_out": str(stem.with_suffix(".pt")), "out": str(out)}
        path = stem.with_suffix(".request.json")
        path.write_text(json.dumps(request), encoding="utf-8")
        return path, out, log, request

    def run(self, arm: Arm, mode: str, iterations: int = 0) -> dict[str, Any]:
        """The child's answer: ``{"result"}`` (measure), ``{"parity", "params"}``, or ``{"error"}`` (one line)."""
        path, out, log, request = self._request(arm, mode, iterations)
        with open(log, "wb") as sink:
            code = subprocess.run([sys.executable, "-m", "harness.trials.child", str(path)], stdout=sink,
                                  stderr=subprocess.STDOUT, env=_child_env(), check=False).returncode
        if code == 130 or code == -2:
            raise KeyboardInterrupt
        try:
            answer = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            answer = {"error": _last_line(log) or f"the arm's process ended with exit code {code}"}
        answer["params"] = request["params_out"]
        answer["log"] = str(log)
        return answer

    def serve(self, arm: Arm) -> ServedArm:
        """The arm's process started: it builds the trainer and warms it up while the parent goes on."""
        path, _out, log, _request = self._request(arm, "serve")
        return ServedArm(path, log)


class ServedArm:
    """One arm's live process: ``ready()`` once its warm-up and checks are done, then ``slice(env_steps)`` as often
    as asked (each answer ``{"env_steps", "wall", "cpu"}`` or ``{"error"}``); ``close()`` ends it. Requests and
    answers are JSON lines on the process's stdin and stdout; whatever the trainer prints goes to the log."""

    def __init__(self, request: Path, log: Path) -> None:
        self.log = log
        self._sink = open(log, "wb")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen([sys.executable, "-m", "harness.trials.child", str(request)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._sink,
                                        env=_child_env(), text=True, bufsize=1)
        self.failed: str | None = None

    def _answer(self) -> dict[str, Any]:
        if self.failed is not None:
            return {"error": self.failed}
        line = self.process.stdout.readline() if self.process.stdout else ""
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
        return self._answer()

    def slice(self, env_steps: int) -> dict[str, Any]:
        if self.failed is None:
            try:
                self.process.stdin.write(json.dumps({"env_steps": env_steps}) + "\n")  # type: ignore[union-attr]
                self.process.stdin.flush()  # type: ignore[union-attr]
            except (BrokenPipeError, OSError):
                pass  # the process ended: its answer says why
        return self._answer()

    def close(self) -> None:
        try:
            if self.process.poll() is None and self.process.stdin:
                self.process.stdin.close()  # end of requests: the child closes its trainer and exits
            self.process.wait(timeout=30)
        except (subprocess.TimeoutExpired, OSError):
            self.process.kill()
            self.process.wait()
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
