"""Reference trainers: PPO, DQN and IQN (and the building blocks they share, in ``common``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .common.config import TrainConfig
from .common.probe import Probe

if TYPE_CHECKING:  # importing resolve imports torch: commands that need no trainer stay light
    from .common.resolve import Resolution


def build_trainer(resolution: Resolution, probe: Probe | None = None):  # noqa: ANN201 - a trainer
    """The trainer for ``resolution.config.algo``, built from an already resolved config."""
    from .dqn import DQNTrainer
    from .iqn import IQNTrainer
    from .ppo import ppo_trainer

    trainers = {"ppo": ppo_trainer, "dqn": DQNTrainer, "iqn": IQNTrainer}
    return trainers[resolution.config.algo](resolution.config, probe=probe, resolution=resolution)


__all__ = ["TrainConfig", "build_trainer"]
