"""``state_dict()`` / ``load_state_dict()`` shared by every trainer (PPO, DQN, IQN).

A trainer's state is its model, learner (optimiser, GradScaler), RNG states (torch global,
every generator the trainer owns, numpy, Python ``random``), the vector env's state
(``env_state.py``), episode bookkeeping and counters; a trainer adds what only it keeps in
``extra_state`` (target network, replay, n-step writer). States are taken between
``iterate()`` calls, where a PPO rollout has been consumed and the statistics flushed.
Guarded by tests/test_checkpoint.py, tests/test_resume.py, tests/test_distributed.py.
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from reference_trainers.state.checkpoint import CheckpointError, capture_rng, config_differences, decode_array, encode_array, restore_rng
from reference_trainers.config.schema import to_plain_dict
from reference_trainers.runtime.distributed import rank, world_size
from reference_trainers.state.env_state import capture_env_state, restore_env_state


class Checkpointable(abc.ABC):
    """``state_dict()`` / ``load_state_dict()`` shared by PPO, DQN and IQN.

    A trainer provides ``rng_generators()`` (every ``torch.Generator`` it owns, by name),
    ``COUNTERS`` (the counter attributes) and may override ``extra_state`` /
    ``load_extra_state`` for what only it keeps (target network, replay, n-step writer).
    """

    COUNTERS: tuple[str, ...] = ("env_steps", "agent_steps", "updates", "iterations")

    @abc.abstractmethod
    def rng_generators(self) -> dict[str, torch.Generator]:
        """Every ``torch.Generator`` the trainer draws from, by a stable name."""

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Nothing beyond the shared state by default."""

    def state_dict(self) -> dict[str, Any]:
        """The trainer's whole state, ready for ``save_checkpoint`` (loads with ``weights_only=True``)."""
        return {
            "algo": self.algo, "config": to_plain_dict(self.config), "rank": rank(), "world_size": world_size(),
            "model": self.model.state_dict(), "learner": self.learner.state_dict(),
            "rng": capture_rng(self.rng_generators()), "envs": capture_env_state(self.envs),
            "next_obs": encode_array(self.next_obs), "episode_over": encode_array(self.episode_over),
            "tracker": self.tracker.state_dict(), "counters": {name: int(getattr(self, name)) for name in self.COUNTERS},
            "last_stats": dict(self.last_stats), "extra": self.extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: it must come from the same algorithm, config and rank layout."""
        if state.get("algo") != self.algo:
            raise CheckpointError(f"checkpoint is of algo {state.get('algo')!r}, this run is {self.algo!r}")
        differences = config_differences(state.get("config") or {}, to_plain_dict(self.config))
        if differences:
            more = f" and {len(differences) - 1} more" if len(differences) > 1 else ""
            raise CheckpointError(f"checkpoint was taken with another config: {differences[0]}{more}")
        if (state.get("rank"), state.get("world_size")) != (rank(), world_size()):
            raise CheckpointError(f"checkpoint is of rank {state.get('rank')} of {state.get('world_size')}, "
                                  f"this process is rank {rank()} of {world_size()}")
        self.model.load_state_dict(state["model"])
        self.learner.load_state_dict(state["learner"])
        restore_env_state(self.envs, state["envs"])
        self.next_obs = decode_array(state["next_obs"])
        self.episode_over = decode_array(state["episode_over"])
        self.tracker.load_state_dict(state["tracker"])
        for name in self.COUNTERS:
            setattr(self, name, int(state["counters"][name]))
        self.last_stats = dict(state["last_stats"])
        self.load_extra_state(state["extra"])
        restore_rng(state["rng"], self.rng_generators())
