"""``rlgauge run --checkpoint-every N`` / ``--resume PATH``: an interrupted run continued from its
checkpoint ends with exactly the parameters of an uninterrupted one; bad checkpoints exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import TINY
from harness.cli import main

TINY_ARGS = [arg for item in TINY for arg in ("--set", item)]
CHECKPOINT = "ppo-cartpole.ckpt.pt"



def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["run", *argv])
    return code, capsys.readouterr().err


def interrupt_after(monkeypatch: pytest.MonkeyPatch, trainer_cls: type, calls: int) -> None:
    """Ctrl-C at the ``calls``-th ``iterate()`` (before it runs)."""
    original, count = trainer_cls.iterate, [0]

    def iterate(self: Any) -> Any:
        count[0] += 1
        if count[0] >= calls:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(trainer_cls, "iterate", iterate)


def final_models(path: Path) -> dict[str, dict[str, torch.Tensor]]:
    payload = torch.load(path, weights_only=True)
    assert payload["finished"] is True
    return {variant: {**state["trainer"]["model"], **{f"target.{k}": v for k, v in
                                                      state["trainer"]["extra"].get("target", {}).items()}}
            for variant, state in payload["variants"].items()}


PRESETS = {
    "ppo": ("ppo-cartpole", "reference_trainers.ppo.trainer.PPOTrainer", []),
    "dqn": ("dqn-cartpole", "reference_trainers.value.loop.ValueTrainer",
            ["dqn.learning_starts=64", "dqn.batch_size=16", "dqn.log_interval=32", "run.steps=128"]),
    "iqn": ("iqn-cartpole", "reference_trainers.value.loop.ValueTrainer",
            ["iqn.learning_starts=64", "iqn.batch_size=16", "iqn.log_interval=32", "run.steps=128",
             "iqn.num_tau_samples=8", "iqn.num_tau_prime_samples=8", "iqn.num_quantile_samples=8",
             "iqn.quantile_embedding_dim=16"]),
}


@pytest.mark.parametrize("algo", sorted(PRESETS))
def test_interrupted_run_resumed_from_its_checkpoint_ends_with_the_uninterrupted_parameters(
        algo: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    preset, trainer_path, extra = PRESETS[algo]
    module, _, name = trainer_path.rpartition(".")
    trainer_cls = getattr(importlib.import_module(module), name)
    args = [preset, *TINY_ARGS, *[a for x in extra for a in ("--set", x)], "--set", "optimizations.torch_threads=1",
            "--repeats", "2", "--quiet",
            "--checkpoint-every", "64"]

    code, err = run(capsys, *args, "--checkpoint-dir", str(tmp_path / "straight"))
    assert code == 0, err
    with monkeypatch.context() as patch:
        interrupt_after(patch, trainer_cls, calls=8)
        code, err = run(capsys, *args, "--checkpoint-dir", str(tmp_path / "cut"))
        assert code == 130, err
    partial = torch.load(tmp_path / "cut" / CHECKPOINT.replace("ppo-cartpole", preset), weights_only=True)
    assert partial["finished"] is False
    code, err = run(capsys, *args, "--checkpoint-dir", str(tmp_path / "cut"), "--resume", str(tmp_path / "cut"),
                    "--out", str(tmp_path / "r.json"))
    assert code == 0, err

    straight = final_models(tmp_path / "straight" / CHECKPOINT.replace("ppo-cartpole", preset))
    resumed = final_models(tmp_path / "cut" / CHECKPOINT.replace("ppo-cartpole", preset))
    assert straight.keys() == resumed.keys() == {"baseline", "optimized"}
    for variant in straight:
        for key, tensor in straight[variant].items():
            assert torch.equal(tensor, resumed[variant][key]), f"{variant} {key}"
    runs = json.loads((tmp_path / "r.json").read_text())["runs"]
    assert all(len(r["metrics"]["env_steps_per_sec"]["samples"]) == 2 and r["status"] == "ok" for r in runs)


def test_checkpoint_dir_defaults_to_checkpoints_beside_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run(capsys, "ppo-cartpole", *TINY_ARGS, "--variant", "baseline", "--quiet", "--checkpoint-every", "32",
                  "--out", str(tmp_path / "res" / "r.json"))
    assert code == 0
    assert (tmp_path / "res" / "checkpoints" / CHECKPOINT).is_file()


def _checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> Path:
    code, _ = run(capsys, "ppo-cartpole", *TINY_ARGS, "--variant", "baseline", "--quiet", "--checkpoint-every", "32",
                  "--checkpoint-dir", str(tmp_path), *extra)
    assert code == 0
    return tmp_path / CHECKPOINT


BAD = {
    "missing file": (lambda p: p / "nothing.pt", [], "checkpoint not found"),
    "corrupt file": (lambda p: (p / "junk.pt").write_bytes(b"\x00garbage") and p / "junk.pt", [],
                     "not a readable checkpoint"),
    "finished run": (lambda p: p / CHECKPOINT, [], "had already finished"),
    "other config": (lambda p: p / CHECKPOINT, ["--set", "ppo.learning_rate=0.01"],
                     "another config: ppo.learning_rate"),
    "other variants": (lambda p: p / CHECKPOINT, ["--variant", "both"], "holds variants baseline"),
    "other preset": (lambda p: p / CHECKPOINT, ["--preset", "dqn-cartpole"], "checkpoint is of 'ppo-cartpole'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_resume_exits_2_with_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path_of, extra, message = BAD[case]
    _checkpoint(tmp_path, capsys)
    if case != "finished run":  # make the checkpoint look unfinished, so the other checks are reached
        payload = torch.load(tmp_path / CHECKPOINT, weights_only=True)
        payload["finished"] = False
        torch.save(payload, tmp_path / CHECKPOINT)
    preset = "ppo-cartpole"
    if extra[:1] == ["--preset"]:
        preset, extra = extra[1], []
    variant = [] if "--variant" in extra else ["--variant", "baseline"]
    code, err = run(capsys, preset, *TINY_ARGS, *variant, *extra, "--quiet", "--resume", str(path_of(tmp_path)))
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_async_envs_cannot_be_checkpointed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "ppo-cartpole", *TINY_ARGS, "--set", "env.vectorization=async", "--variant", "baseline",
                    "--checkpoint-every", "32", "--checkpoint-dir", str(tmp_path))
    assert code == 2 and "async keeps its envs in subprocesses" in err
    assert not list(tmp_path.iterdir())


def test_checkpoint_options_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "ppo-cartpole", *TINY_ARGS, "--checkpoint-every", "0")
    assert code == 2 and "--checkpoint-every 0: expected a positive number" in err
    code, err = run(capsys, "ppo-cartpole", *TINY_ARGS, "--checkpoint-dir", str(tmp_path))
    assert code == 2 and "only used with --checkpoint-every or --resume" in err


def test_under_torchrun_each_rank_resumes_from_its_own_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.measurement import checkpoints
    from harness.errors import UserError

    monkeypatch.setattr(checkpoints.distributed, "world_size", lambda: 2)
    monkeypatch.setattr(checkpoints.distributed, "rank", lambda: 1)
    assert checkpoints.file_name("ppo-cartpole") == "ppo-cartpole.rank1.ckpt.pt"
    assert checkpoints.resume_file(tmp_path, "ppo-cartpole") == tmp_path / "ppo-cartpole.rank1.ckpt.pt"
    given = tmp_path / "ppo-cartpole.rank0.ckpt.pt"
    assert checkpoints.resume_file(given, "ppo-cartpole") == tmp_path / "ppo-cartpole.rank1.ckpt.pt"
    with pytest.raises(UserError, match="under torchrun give the checkpoint folder"):
        checkpoints.resume_file(tmp_path / "mine.pt", "ppo-cartpole")
