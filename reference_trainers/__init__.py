"""Reference trainers: PPO (and the building blocks the trainers share, in ``common``)."""

from __future__ import annotations

from .common.config import TrainConfig
from .common.probe import Probe
from .common.resolve import Resolution


def build_trainer(resolution: Resolution, probe: Probe | None = None):  # noqa: ANN201 - a trainer
    """The trainer for ``resolution.config.algo``, built from an already resolved config."""
    from .ppo import PPOTrainer

    trainers = {"ppo": PPOTrainer}
    return trainers[resolution.config.algo](resolution.config, probe=probe, resolution=resolution)


__all__ = ["TrainConfig", "build_trainer"]
