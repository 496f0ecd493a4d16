"""``rlgauge try`` survives its arms: a hung arm fails alone after ``--timeout`` with one line, and the work folder of
a try where something failed is kept and named (docs/try.md)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.cli.app import main
from harness.trials.processes.arms import ServedArm, Silence

TESTS = Path(__file__).resolve().parent
HANGING_YAML = """\
trainer: try_hanging:make_trainer
config: {hang_in_changed_arm: true}
run: {steps: 64, warmup_steps: 32, repeats: 2}
"""


@pytest.fixture(autouse=True)
def _one_thread_in_the_arms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_a_served_arm_that_stops_answering_fails_with_one_line_and_is_stopped(tmp_path: Path) -> None:
    """A process that says it is ready and then never answers a slice."""
    silent = "import sys, time; print('{\"ready\": true}', flush=True); time.sleep(600)"
    arm = ServedArm([sys.executable, "-c", silent], tmp_path / "arm.log", Silence(None, 5.0))
    try:
        assert arm.ready() == {"ready": True}
        answer = arm.slice(100)
        assert answer == {"error": "timed out: no progress for 5 s (--timeout); the arm's process was stopped"}
        assert arm.process.poll() is not None  # stopped, not left behind
        assert arm.slice(100) == answer  # a failed arm keeps its cause
    finally:
        arm.close()


def test_a_hung_arm_fails_alone_after_the_timeout_and_the_work_folder_is_kept(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The trainer hangs for ever once distribution checks are off (``no_validate_args``); the A/A arm goes on."""
    shutil.copy(TESTS / "try_parity_trainer.py", tmp_path / "try_hanging.py")
    (tmp_path / "hanging.yaml").write_text(HANGING_YAML)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["try", str(tmp_path / "hanging.yaml"), "--device", "cpu", "--steps", "64", "--json", "--quiet",
                     "--rounds", "2", "--repeats", "1", "--timeout", "20", "--only", "no_change,no_validate_args"])
    data: dict[str, Any] = json.loads(out.getvalue())["try"]
    err = capsys.readouterr().err.strip().splitlines()
    try:
        trials = {t["change"]: t for t in data["trials"]}
        assert code == 1
        hung = trials["no_validate_args"]
        assert hung["verdict"] == "failed: timed out: no progress for 20 s (--timeout); the arm's process was stopped"
        assert hung["ratio"] is None and Path(hung["log"]).parent == Path(data["workdir"])
        assert trials["no_change"]["error"] is None and trials["no_change"]["ratio"]["pairs"] == 2, trials["no_change"]
        assert Path(data["workdir"]).is_dir() and Path(hung["log"]).is_file()
        assert err == [f"rlgauge: work folder kept (requests and logs of what failed): {data['workdir']}",
                       f"rlgauge: no_validate_args failed: timed out: no progress for 20 s (--timeout); the arm's "
                       f"process was stopped (log: {hung['log']})"]
    finally:
        if data.get("workdir"):
            shutil.rmtree(data["workdir"], ignore_errors=True)
