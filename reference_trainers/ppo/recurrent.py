"""Recurrent PPO (``model.recurrent: lstm|gru``): PPO with memory for partially observed tasks.

Everything but the parts that carry the hidden state is ``PPOTrainer``'s. Here:

- acting carries one state row per sub-env and zeroes it where an observation opens an
  episode (the first observation after ``reset`` and the reset step's returned observation,
  under the NEXT_STEP autoreset every backend follows). The plain path runs the cell per
  sub-env on its own state row; ``batch_inference`` runs all sub-envs' rows in one call;
- the update trains on sequence minibatches: whole sub-env sequences of ``ppo.num_steps``
  steps (truncated back-propagation through time), replayed from the state the rollout
  started with, so ``ppo.num_minibatches`` must divide ``env.num_envs``.

Episode starts are not stored: the step after a reset step opens an episode, so within a
rollout ``starts[t] = 1 - valid[t-1]``; only the first step's flags are kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from reference_trainers.state.checkpoint import decode_array, encode_array
from reference_trainers.nets.networks import RecurrentActorCritic
from reference_trainers.ppo.loss import ppo_loss
from reference_trainers.ppo.policy import PPOPolicy, evaluate_actions, sample_action
from reference_trainers.ppo.trainer import PPOTrainer

__all__ = ["RecurrentPPOTrainer", "RecurrentPolicy", "episode_starts"]


def episode_starts(first: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(T, N) flags of observations that open an episode: ``first`` (N,) for step 0, then
    the steps after reset steps (``valid == 0``)."""
    return torch.cat([first.unsqueeze(0), 1.0 - valid[:-1]])


class RecurrentPolicy(PPOPolicy):
    """The recurrent sampling policy for ``paths.acting``: one hidden-state row per sub-env,
    zeroed where an observation opens an episode. A step's start flags are taken with its
    noise (``draw``) and cross to the device with its observations (``inputs``); each forward
    runs on its rows' state and writes their new state back."""

    def __init__(self, *args: Any, episode_over: Callable[[], np.ndarray], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.episode_over = episode_over
        self.state = self.model.initial_state(self.num_envs, self.device)
        self.starts = np.ones(self.num_envs, dtype=bool)  # the next observation opens an episode

    def take_starts(self) -> np.ndarray:
        """This step's episode-start flags; the next step opens an episode if this is a reset step."""
        starts, self.starts = self.starts, self.episode_over().copy()
        return starts.astype(np.float32)

    def draw(self) -> tuple[torch.Tensor, np.ndarray]:
        return super().draw(), self.take_starts()

    def inputs(self, obs: np.ndarray, start: int, stop: int, draws: tuple[torch.Tensor, np.ndarray]
               ) -> tuple[torch.Tensor, ...]:
        rows = stop - start
        whole = rows == self.num_envs
        return (self.to_device.observations(obs[start:stop].reshape(rows, -1), "obs" if whole else "obs_row"),
                self.to_device(draws[1][start:stop], "starts" if whole else "start_row"))

    def __call__(self, inputs: tuple[torch.Tensor, ...], draws: tuple[torch.Tensor, np.ndarray], start: int,
                 stop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        obs, starts = inputs
        with torch.no_grad():
            with self.autocast():
                actor_out, value, new_state = self.forward(obs, self.state[start:stop], starts)
            action, logprob = sample_action(actor_out, self.log_std(), draws[0][start:stop])
        self.state[start:stop] = new_state
        return action, logprob, value.float()


class RecurrentPPOTrainer(PPOTrainer):
    """PPO with an LSTM or GRU core; see the module docstring for what differs."""

    policy: RecurrentPolicy

    def build_model(self, action_space: gym.Space) -> nn.Module:
        return RecurrentActorCritic(self.obs_dim, action_space, self.config.model)

    def build_policy(self) -> RecurrentPolicy:
        return RecurrentPolicy(self.model, self.forward, self.learner.autocast, self.to_device, self.generator,
                               self.device, self.num_envs, self.obs_shape, bool(self.config.optimizations.stacked_mlps),
                               episode_over=lambda: self.episode_over)

    @property
    def state(self) -> torch.Tensor:
        """Every sub-env's hidden state (the acting policy's)."""
        return self.policy.state

    @state.setter
    def state(self, value: torch.Tensor) -> None:
        self.policy.state = value

    @property
    def starts(self) -> np.ndarray:
        """Which sub-envs' next observation opens an episode."""
        return self.policy.starts

    @starts.setter
    def starts(self, value: np.ndarray) -> None:
        self.policy.starts = value

    def allocate_storage(self) -> None:
        super().allocate_storage()
        self.rollout_state = self.state.clone()
        self.rollout_starts = torch.ones(self.num_envs, device=self.device)

    def select_actions(self, obs: np.ndarray) -> np.ndarray:
        """One action selection that leaves the rollout's hidden state and flags as they were."""
        saved = self.state.clone(), self.starts.copy()
        try:
            return super().select_actions(obs)
        finally:
            self.state, self.starts = saved

    # ----------------------------------------------------------------- checkpoints
    def extra_state(self) -> dict[str, Any]:
        """The hidden state of every sub-env and which of them open an episode next."""
        return {**super().extra_state(), "hidden": self.state.detach().cpu(), "starts": encode_array(self.starts)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        super().load_extra_state(state)
        self.state = state["hidden"].to(self.device)
        self.starts = decode_array(state["starts"])

    # ----------------------------------------------------------------- collect and update
    def collect(self) -> tuple[int, int]:
        self.rollout_state = self.state.clone()
        self.rollout_starts = self.to_device(self.starts.astype(np.float32), "starts")
        return super().collect()

    def minibatch_loss(self, obs: torch.Tensor, actions: torch.Tensor, old_logprob: torch.Tensor,  # type: ignore[override]
                        advantages: torch.Tensor, returns: torch.Tensor, old_value: torch.Tensor, mask: torch.Tensor,
                        starts: torch.Tensor, initial_state: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The PPO loss of a (T, M) block of M whole sub-env sequences, unrolled from their initial state."""
        with self.learner.autocast():
            actor_out, new_value, _ = self.learner.train_model(obs, initial_state, starts)
        log_std = None if self.discrete else self.model.log_std
        flat = lambda x: x.flatten(0, 1)  # noqa: E731
        new_logprob, entropy = evaluate_actions(flat(actor_out), log_std, flat(actions))
        return ppo_loss(new_logprob, entropy, flat(new_value).float(), flat(old_logprob), flat(advantages),
                        flat(returns), flat(old_value), flat(mask), self.loss_coefs)

    def update(self) -> int:
        """GAE, then ``update_epochs`` passes over minibatches of whole sub-env sequences."""
        c = self.config
        with self.probe.phase("inference"):
            next_obs = self.to_device.observations(self.next_obs.reshape(self.num_envs, -1), "obs")
            starts = self.to_device(self.starts.astype(np.float32), "starts")
            with torch.no_grad(), self.learner.autocast():
                _, next_value, _ = self.forward(next_obs, self.state, starts)
        with self.probe.phase("update"):
            self._set_learning_rate()
            advantages, returns = self.gae(self.rewards_buf, self.values_buf, next_value.float(), self.terminated_buf,
                                           self.truncated_buf, self.valid_buf, c.ppo.gamma, c.ppo.gae_lambda)
            sequences = (self.obs_buf, self.actions_buf, self.logprobs_buf, advantages, returns, self.values_buf,
                         self.valid_buf, episode_starts(self.rollout_starts, self.valid_buf))
            per_minibatch = self.num_envs // c.ppo.num_minibatches
            steps = 0
            gather = lambda envs: (*(x[:, envs] for x in sequences), self.rollout_state[envs])  # noqa: E731
            for _ in range(c.ppo.update_epochs):
                order = torch.randperm(self.num_envs, generator=self.generator, device=self.device)
                chunks = (order[start:start + per_minibatch] for start in range(0, self.num_envs, per_minibatch))
                # gathered inline, or ahead on background threads (num_workers) while earlier ones train
                for minibatch in self.prefetcher.map(gather, chunks):
                    self.learner.step(*minibatch)
                    steps += 1
        return steps

