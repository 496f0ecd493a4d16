"""Run checkpoints: where ``rlgauge run --checkpoint-every N`` writes, when, and what ``--resume`` reads.

A run checkpoint holds, for every variant of the run, its trainer's ``state_dict()`` and
the runner's progress (warm-up done, rates of finished repeats, the part of the current
repeat already timed). It is written between iterations, whenever a variant's env steps
pass a multiple of N, and once more when the run ends (``finished``). One file per
process: ``DIR/PRESET.ckpt.pt``, or ``DIR/PRESET.rankR.ckpt.pt`` per rank under torchrun.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_trainers import check_checkpointable
from reference_trainers.runtime import distributed
from reference_trainers.state.checkpoint import (FORMAT, VERSION, CheckpointError, config_differences,
                                                  load_checkpoint, save_checkpoint)
from reference_trainers.config.schema import TrainConfig, to_plain_dict

from harness.errors import UserError

KIND = "run"
SUFFIX = ".ckpt.pt"


def file_name(preset: str) -> str:
    """This process's checkpoint file name for ``preset`` (with ``.rankR`` under torchrun)."""
    rank = f".rank{distributed.rank()}" if distributed.world_size() > 1 else ""
    return f"{preset}{rank}{SUFFIX}"


def default_directory(out: Path | None) -> Path:
    """``checkpoints/`` beside ``--out`` (or in the current folder without ``--out``)."""
    return (out.parent if out is not None else Path(".")) / "checkpoints"


def resume_file(path: Path, preset: str) -> Path:
    """``--resume PATH``: a checkpoint file, or the folder holding this process's file.

    Under torchrun a file of any rank may be given: each rank reads its own sibling.
    """
    path = Path(path)
    if path.is_dir():
        return path / file_name(preset)
    if distributed.world_size() > 1:
        renamed, count = re.subn(r"\.rank\d+(?=\.ckpt\.pt$)", f".rank{distributed.rank()}", path.name)
        if not count:
            raise UserError(f"--resume {path}: under torchrun give the checkpoint folder or a PRESET.rankR{SUFFIX} file")
        return path.with_name(renamed)
    return path


@dataclass
class Checkpointing:
    """``--checkpoint-every N`` into ``path``; ``resumed`` is the checkpoint a resumed run started from."""

    every: int | None
    path: Path
    resumed: dict[str, Any] | None = None

    def index(self, env_steps: int) -> int:
        """How many multiples of ``every`` the run's ``env_steps`` (agreed over the ranks) have passed."""
        return distributed.agreed_min(env_steps) // self.every if self.every else 0

    def save(self, preset: str, variants: dict[str, dict[str, Any]], finished: bool) -> None:
        """Write the checkpoint atomically (nothing when only resuming, without ``--checkpoint-every``)."""
        if self.every is None:
            return
        save_checkpoint(self.path, {"format": FORMAT, "version": VERSION, "kind": KIND, "preset": preset,
                                    "finished": finished, "variants": variants})

    def variant_state(self, variant: str) -> dict[str, Any] | None:
        return None if self.resumed is None else self.resumed["variants"][variant]


def check_every(every: int | None) -> None:
    if every is not None and every < 1:
        raise UserError(f"--checkpoint-every {every}: expected a positive number of env steps")


def load_run_checkpoint(path: Path, preset: str, configs: dict[str, TrainConfig]) -> dict[str, Any]:
    """Read ``--resume``'s checkpoint and check it belongs to this run: same preset, variants and
    resolved configs, and not finished. ``UserError`` (one line) otherwise."""
    try:
        payload = load_checkpoint(path)
    except CheckpointError as exc:
        raise UserError(f"--resume: {exc}") from None
    if payload.get("kind") != KIND or not isinstance(payload.get("variants"), dict):
        raise UserError(f"--resume {path}: not a run checkpoint (written by 'rlgauge run --checkpoint-every')")
    if payload.get("preset") != preset:
        raise UserError(f"--resume {path}: checkpoint is of {payload.get('preset')!r}, this run is {preset!r}")
    if sorted(payload["variants"]) != sorted(configs):
        raise UserError(f"--resume {path}: checkpoint holds variants {', '.join(sorted(payload['variants']))}; "
                        f"this run has {', '.join(sorted(configs))} (choose them with --variant)")
    if payload.get("finished"):
        raise UserError(f"--resume {path}: the checkpointed run had already finished; nothing to resume")
    for variant, config in configs.items():
        trainer = payload["variants"][variant]["trainer"]
        current = config.plain() if hasattr(config, "plain") else to_plain_dict(config)  # a user's trainer: OwnConfig
        differences = config_differences(trainer.get("config") or {}, current)
        if differences:
            more = f" and {len(differences) - 1} more" if len(differences) > 1 else ""
            raise UserError(f"--resume {path}: {variant} was checkpointed with another config: {differences[0]}{more}")
    return payload


def check_envs(configs: list[TrainConfig]) -> None:
    """Fail before a run if its envs cannot be checkpointed (``async``)."""
    for config in configs:
        if not hasattr(config.env, "vectorization"):  # a user's trainer: its own envs, its own state_dict
            continue
        try:
            check_checkpointable(config.env.vectorization)
        except CheckpointError as exc:
            raise UserError(f"--checkpoint-every: {exc}") from None
