"""Reference trainers: PPO, DQN and IQN (and the building blocks they share, in sub-packages by concept).

This module is what the harness imports for trainers: the ``Trainer`` protocol, ``build_trainer``
and the few building blocks it measures on their own. Names whose modules import torch load on
first use, so commands that train nothing stay light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from reference_trainers.config.schema import TrainConfig
from reference_trainers.runtime.probe import Probe

if TYPE_CHECKING:
    import numpy as np

    from reference_trainers.replay.buffers import ReplayBuffer, make_replay
    from reference_trainers.state.env_state import check_checkpointable
    from reference_trainers.envs.factory import frames_in_step, make_vector_env
    from reference_trainers.paths.learner import NonFiniteError, apply_process_settings
    from reference_trainers.replay.writers import TransitionBatch
    from reference_trainers.config.resolve import Resolution
    from reference_trainers.paths.speedups import HostToDevice
    from reference_trainers.runtime.trainer import IterationResult


@runtime_checkable
class Trainer(Protocol):
    """What the harness calls on a trainer (``harness.measurement.runner``, ``harness.analyses.rss_growth``)."""

    @property
    def env_steps(self) -> int:
        """Sub-env frames taken so far."""

    @property
    def iterations(self) -> int:
        """``iterate()`` calls so far."""

    @property
    def next_obs(self) -> np.ndarray:
        """The observations the next action selection sees."""

    @property
    def nonfinite_events(self) -> int:
        """NaN/Inf losses or gradients seen (and skipped) so far."""

    @property
    def compile_fallback(self) -> bool:
        """True if a compiled function fell back to eager."""

    def iterate(self) -> IterationResult:
        """One training iteration (collect, then update); what it did."""

    def activate(self) -> None:
        """Apply this trainer's process-wide settings (threads, matmul precision)."""

    def select_actions(self, obs: np.ndarray) -> np.ndarray:
        """One batched action selection that leaves the training state as it was."""

    def mean_recent_return(self) -> float | None:
        """Mean return of the last completed episodes, or None before the first."""

    def close(self) -> None:
        """Release envs and worker threads."""


@runtime_checkable
class ResumableTrainer(Trainer, Protocol):
    """A trainer that ``--checkpoint-every`` and ``--resume`` can save and restore between iterations."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit for bit."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a ``state_dict()`` of a trainer built from the same config."""


def build_trainer(resolution: Resolution, probe: Probe | None = None) -> ResumableTrainer:
    """The trainer for ``resolution.config``'s algorithm (recurrent PPO when ``model.recurrent`` is set)."""
    config = resolution.config
    if config.algo == "ppo" and config.model.recurrent == "none":
        from reference_trainers.ppo.trainer import PPOTrainer as trainer_cls
    elif config.algo == "ppo":
        from reference_trainers.ppo.recurrent import RecurrentPPOTrainer as trainer_cls
    elif config.algo == "dqn":
        from reference_trainers.value.dqn import DQNTrainer as trainer_cls
    else:
        from reference_trainers.value.iqn import IQNTrainer as trainer_cls
    return trainer_cls(config, probe=probe, resolution=resolution)


_LAZY = {  # name -> the module that defines it (each imports torch)
    "HostToDevice": "reference_trainers.paths.speedups",
    "IterationResult": "reference_trainers.runtime.trainer",
    "NonFiniteError": "reference_trainers.paths.learner",
    "ReplayBuffer": "reference_trainers.replay.buffers",
    "TransitionBatch": "reference_trainers.replay.writers",
    "apply_process_settings": "reference_trainers.paths.learner",
    "check_checkpointable": "reference_trainers.state.env_state",
    "frames_in_step": "reference_trainers.envs.factory",
    "make_replay": "reference_trainers.replay.buffers",
    "make_vector_env": "reference_trainers.envs.factory",
}


def __getattr__(name: str) -> Any:
    """The names in ``_LAZY``, imported on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


__all__ = ["HostToDevice", "IterationResult", "NonFiniteError", "ReplayBuffer", "ResumableTrainer", "TrainConfig",
           "Trainer", "TransitionBatch", "apply_process_settings", "build_trainer", "check_checkpointable",
           "frames_in_step", "make_replay", "make_vector_env"]
