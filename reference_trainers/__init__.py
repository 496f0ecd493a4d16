"""Reference trainers: PPO, DQN and IQN (and the building blocks they share, in ``common``).

This module is what the harness imports for trainers: the ``Trainer`` protocol, ``build_trainer``
and the few building blocks it measures on their own. Names whose modules import torch load on
first use, so commands that train nothing stay light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .common.config import TrainConfig
from .common.probe import Probe

if TYPE_CHECKING:
    import numpy as np

    from .common.buffers import ReplayBuffer, make_replay
    from .common.env_state import check_checkpointable
    from .common.envs import frames_in_step, make_vector_env
    from .common.learner import NonFiniteError, apply_process_settings
    from .common.nstep import TransitionBatch
    from .common.resolve import Resolution
    from .common.speedups import HostToDevice
    from .common.trainer import IterationResult


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
        from .ppo import PPOTrainer as trainer_cls
    elif config.algo == "ppo":
        from .recurrent_ppo import RecurrentPPOTrainer as trainer_cls
    elif config.algo == "dqn":
        from .dqn import DQNTrainer as trainer_cls
    else:
        from .iqn import IQNTrainer as trainer_cls
    return trainer_cls(config, probe=probe, resolution=resolution)


_LAZY = {  # name -> the module that defines it (each imports torch)
    "HostToDevice": ".common.speedups",
    "IterationResult": ".common.trainer",
    "NonFiniteError": ".common.learner",
    "ReplayBuffer": ".common.buffers",
    "TransitionBatch": ".common.nstep",
    "apply_process_settings": ".common.learner",
    "check_checkpointable": ".common.env_state",
    "frames_in_step": ".common.envs",
    "make_replay": ".common.buffers",
    "make_vector_env": ".common.envs",
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
