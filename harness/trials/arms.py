"""The parent's side of an arm: what to run (the runtime changes and the folder of patched copies) and running
it in a fresh process (``child``), its output kept in a log beside the request."""

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

    def run(self, arm: Arm, mode: str, iterations: int = 0) -> dict[str, Any]:
        """The child's answer: ``{"result"}`` (measure), ``{"parity", "params"}``, or ``{"error"}`` (one line)."""
        self.count += 1
        stem = self.workdir / f"{self.count:03d}-{arm.name}-{mode}"
        out, log = stem.with_suffix(".answer.json"), stem.with_suffix(".log")
        request = {"mode": mode, "target": self.target.target, "trainer": self.target.trainer,
                   "config": self.target.config, "variant": self.target.variant,
                   "overrides": self.target.overrides, "sys_path": self.target.sys_path,
                   "changes": list(arm.runtime), "patched_dir": str(arm.patched_dir) if arm.patched_dir else None,
                   "iterations": iterations, "params_out": str(stem.with_suffix(".pt")), "out": str(out)}
        path = stem.with_suffix(".request.json")
        path.write_text(json.dumps(request), encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (HARNESS_ROOT, os.environ.get("PYTHONPATH"))
                                                            if p)}
        with open(log, "wb") as sink:
            code = subprocess.run([sys.executable, "-m", "harness.trials.child", str(path)], stdout=sink,
                                  stderr=subprocess.STDOUT, env=env, check=False).returncode
        if code == 130 or code == -2:
            raise KeyboardInterrupt
        try:
            answer = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            answer = {"error": _last_line(log) or f"the arm's process ended with exit code {code}"}
        answer["params"] = request["params_out"]
        answer["log"] = str(log)
        return answer


def _last_line(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return ""
    return next((line for line in reversed(lines) if line), "")
