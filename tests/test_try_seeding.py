"""``rlgauge try`` on a trainer whose randomness escapes its seed: the maths check's process names the unseeded
source (an env's first reset without a seed, torch's generator left unseeded) and its one-line fix, and the
report says so instead of a bare "not reproducible" (docs/try.md)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from harness.trials import session
from harness.trials.processes.arms import Arm, ArmRunner, Target
from harness.trials.report import unseeded_lines

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _one_thread_in_the_arms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _runner(tmp_path: Path, config: str) -> ArmRunner:
    shutil.copy(TESTS / "try_unseeded_trainer.py", tmp_path / "try_unseeded.py")
    (tmp_path / "unseeded.yaml").write_text(f"trainer: try_unseeded:make_trainer\nconfig: {config}\n"
                                            "run: {steps: 64, warmup_steps: 16, repeats: 2}\n")
    return ArmRunner(Target(str(tmp_path / "unseeded.yaml"), None, None, "baseline", [], [str(tmp_path), *sys.path],
                            fair_threads=False), tmp_path)


def _two_runs(tmp_path: Path, config: str) -> tuple[dict, dict]:
    """The unchanged trainer's maths check twice, each in an arm's process."""
    runner = _runner(tmp_path, config)
    try:
        return runner.run(Arm("unchanged"), "parity", 3), runner.run(Arm("unchanged"), "parity", 3)
    finally:
        runner.close()


def _line(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_an_env_reset_without_a_seed_is_named_with_its_fix(tmp_path: Path) -> None:
    first, second = _two_runs(tmp_path, "{reset_seed: false, torch_from_entropy: true}")
    assert "error" not in first, first
    found = session._unseeded(first, second)
    line = _line(tmp_path / "try_unseeded.py", "obs, _ = envs.reset(seed=seed) if")
    assert found[0]["what"].startswith("the weights before the first optimizer step differ")  # torch's generator
    assert found[0]["fix"] == "torch.manual_seed(seed) at the top of the factory"
    assert found[1]["where"].endswith(f"try_unseeded.py:{line}")
    assert "the first reset of a SyncVectorEnv has no seed" in found[1]["what"]
    assert found[1]["fix"].startswith("envs.reset(seed=seed)")


def test_a_seeded_trainer_has_nothing_to_seed(tmp_path: Path) -> None:
    first, second = _two_runs(tmp_path, "{}")
    assert first["parity"]["unseeded"] == [] and session._unseeded(first, second) == []


def test_the_report_says_what_to_seed_where_the_unchanged_trainer_differs_from_itself() -> None:
    from harness.trials.session import TryReport

    report = TryReport("x.yaml", "baseline", "cpu", 5, 3, noise=0.3, unseeded=[
        {"where": "/somewhere/train.py:12", "what": "envs.reset(): the first reset of a SyncVectorEnv has no seed",
         "fix": "envs.reset(seed=seed) (the factory's seed; later resets need none)"}])
    lines = unseeded_lines(report)
    assert lines[0].startswith("Not reproducible: the unchanged trainer run twice from its seed differs by 0.3")
    assert lines[1] == ("- /somewhere/train.py:12: envs.reset(): the first reset of a SyncVectorEnv has no seed; "
                        "fix: envs.reset(seed=seed) (the factory's seed; later resets need none)")
    report.unseeded = []
    assert "torch.manual_seed(seed), np.random.seed(seed)" in unseeded_lines(report)[1]
    report.noise = 0.0
    assert unseeded_lines(report) == []


def test_an_env_autoreset_inside_a_vector_env_step_is_not_taken_for_the_user_s_reset(tmp_path: Path) -> None:
    """SyncVectorEnv resets its finished envs inside ``step()``: only the user's own first reset is named."""
    runner = _runner(tmp_path, "{reset_seed: false}")
    try:
        answer = runner.run(Arm("unchanged"), "parity", 40)  # CartPole episodes end within 40 steps
    finally:
        runner.close()
    assert [found["what"].split(":")[0] for found in answer["parity"]["unseeded"]] == ["envs.reset()"]
