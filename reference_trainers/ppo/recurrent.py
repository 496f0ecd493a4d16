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

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from reference_trainers.state.checkpoint import decode_array, encode_array
from reference_trainers.nets.networks import RecurrentActorCritic
from reference_trainers.ppo.loss import ppo_loss
from reference_trainers.ppo.trainer import PPOTrainer, evaluate_actions, sample_action

__all__ = ["RecurrentPPOTrainer", "episode_starts"]


def episode_starts(first: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(T, N) flags of observations that open an episode: ``first`` (N,) for step 0, then
    the steps after reset steps (``valid == 0``)."""
    return torch.cat([first.unsqueeze(0), 1.0 - valid[:-1]])


class RecurrentPPOTrainer(PPOTrainer):
    """PPO with an LSTM or GRU core; see the module docstring for what differs."""

    def build_model(self, action_space: gym.Space) -> nn.Module:
        return RecurrentActorCritic(self.obs_dim, action_space, self.config.model)

    def _allocate_storage(self) -> None:
        super()._allocate_storage()
        self.state = self.model.initial_state(self.num_envs, self.device)
        self.starts = np.ones(self.num_envs, dtype=bool)   # the next observation opens an episode
        self.rollout_state = self.state.clone()
        self.rollout_starts = torch.ones(self.num_envs, device=self.device)

    # ----------------------------------------------------------------- acting
    def _recurrent_policy(self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor, noise: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            with self.learner.autocast():
                actor_out, value, new_state = self.forward(obs, state, starts)
            log_std = None if self.discrete else self.model.log_std
            action, logprob = sample_action(actor_out, log_std, noise)
        return action, logprob, value.float(), new_state

    def _take_starts(self) -> np.ndarray:
        """This step's episode-start flags; the next step opens an episode if this is a reset step."""
        starts, self.starts = self.starts, self.episode_over.copy()
        return starts.astype(np.float32)

    def _act_per_env(self, obs: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray]:
        """Plain path: per sub-env, a forward on its own state row and a host copy of its action."""
        probe, starts = self.probe, self._take_starts()
        obs_rows, actions, logprobs, values, host_actions = [], [], [], [], []
        with probe.phase("inference"):
            noise = self._action_noise()
        for i in range(self.num_envs):
            with probe.phase("transfer"):
                obs_i = self.to_device.observations(obs[i:i + 1].reshape(1, -1), "obs_row")
                start_i = self.to_device(starts[i:i + 1], "start_row")
            with probe.phase("inference"):
                action, logprob, value, state = self._recurrent_policy(obs_i, self.state[i:i + 1], start_i, noise[i:i + 1])
                self.state[i:i + 1] = state
                host_actions.append(action.cpu().numpy()[0])
            obs_rows.append(obs_i)
            actions.append(action)
            logprobs.append(logprob)
            values.append(value)
        return (torch.cat(obs_rows), torch.cat(actions), torch.cat(logprobs), torch.cat(values), np.stack(host_actions))

    def _act_batched(self, obs: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray]:
        """Optimised path: one copy of observations and flags, every sub-env's state in one call (chunked)."""
        starts = self._take_starts()
        with self.probe.phase("transfer"):
            obs_t = self.to_device.observations(obs.reshape(self.num_envs, -1), "obs")
            starts_t = self.to_device(starts, "starts")
        with self.probe.phase("inference"):
            chunk = self.config.optimizations.inference_batch_size or self.num_envs
            noise, parts = self._action_noise(), []
            for s in range(0, self.num_envs, chunk):
                *outputs, state = self._recurrent_policy(obs_t[s:s + chunk], self.state[s:s + chunk], starts_t[s:s + chunk],
                                                       noise[s:s + chunk])
                parts.append(outputs)
                self.state[s:s + chunk] = state
            action, logprob, value = (torch.cat(p) for p in zip(*parts))
            host_actions = action.cpu().numpy()
        return obs_t, action, logprob, value, host_actions

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

    def _minibatch_loss(self, obs: torch.Tensor, actions: torch.Tensor, old_logprob: torch.Tensor,  # type: ignore[override]
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

