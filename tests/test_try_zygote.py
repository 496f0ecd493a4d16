"""``rlgauge try``'s arm processes forked from a warm zygote (``harness.trials.processes.zygote``): they answer as fresh
processes do, the same maths to the bit, served slices, exit codes and kills as ``subprocess.Popen`` gives them,
and plain processes where the zygote cannot start (docs/try.md)."""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path

import pytest
import torch

from harness.trials import parity
from harness.trials.processes.arms import Arm, ArmRunner, Target, stop

TESTS = Path(__file__).resolve().parent
YAML = """\
trainer: try_parity_forked:make_trainer
config: {}
run: {steps: 64, warmup_steps: 32, repeats: 2}
"""


@pytest.fixture(autouse=True)
def _one_thread_in_the_arms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _runner(tmp_path: Path, forked: bool) -> ArmRunner:
    shutil.copy(TESTS / "try_parity_trainer.py", tmp_path / "try_parity_forked.py")
    (tmp_path / "forked.yaml").write_text(YAML)
    work = tmp_path / ("forked" if forked else "plain")
    work.mkdir(exist_ok=True)
    return ArmRunner(Target(str(tmp_path / "forked.yaml"), None, None, "baseline", [], [str(tmp_path), *sys.path],
                            fair_threads=False), work, forked=forked)


def test_a_forked_arm_computes_what_a_fresh_process_computes(tmp_path: Path) -> None:
    forked, plain = _runner(tmp_path, True), _runner(tmp_path, False)
    try:
        from_zygote = forked.run(Arm("unchanged"), "parity", 3)
        assert forked._zygote, "the zygote did not start"
        from_scratch = plain.run(Arm("unchanged"), "parity", 3)
    finally:
        forked.close()
    assert "error" not in from_zygote and "error" not in from_scratch, (from_zygote, from_scratch)
    assert parity.compare(parity.load(from_zygote["params"]), parity.load(from_scratch["params"])).value == 0.0
    assert from_zygote["parity"]["optimizer_classes"] == ["Adam"]


def test_a_forked_arm_serves_slices_and_ends_with_its_exit_code(tmp_path: Path) -> None:
    runner = _runner(tmp_path, True)
    try:
        served = runner.serve(Arm("unchanged"), checks=False, parity_iterations=2)
        ready = served.ready()
        assert ready["ready"] and ready["parity"]["calls"] >= 2 and Path(ready["params"]).exists()
        assert "float64_ops" not in ready  # no checks asked for
        answer = served.slice(16)
        assert answer["env_steps"] >= 16 and answer["wall"] > 0
        served.close()
        assert served.process.returncode == 0
        hung = runner.serve(Arm("unchanged"), checks=False)
        assert hung.ready()["ready"]
        stop(hung.process)  # a hung arm: killed, its exit code a signal's, as Popen gives it
        assert hung.process.returncode == -signal.SIGKILL
        hung.close()
    finally:
        runner.close()
    assert runner._zygote is None


def test_arms_start_as_plain_processes_where_the_zygote_cannot_start(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.trials.processes import zygote

    def broken(_env: dict[str, str]) -> None:
        raise OSError("the zygote did not start")

    monkeypatch.setattr(zygote, "Zygote", broken)
    runner = _runner(tmp_path, True)
    answer = runner.run(Arm("unchanged"), "parity", 2)
    assert "error" not in answer and runner._zygote is False
    assert isinstance(torch.load(answer["params"], weights_only=True)["final"], dict)
