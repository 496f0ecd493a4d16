"""PPO (Schulman et al. 2017; CleanRL-style): clipped policy and value objective, GAE,
entropy bonus, minibatch epochs, gradient clipping.

Read top to bottom: pure step functions (sampling, GAE, loss), then ``PPOTrainer``, which
builds envs, network, optimiser and storage from a ``TrainConfig`` and picks, flag by
flag, the plain or the optimised path. With every flag plain this is the reference
algorithm. Autoreset follows gymnasium's NEXT_STEP semantics on every backend: the step
after an episode ends is a reset step, masked out of the loss and advantages.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from reference_trainers.nets import mlp
from reference_trainers.runtime import distributed
from reference_trainers.paths import numpy_acting as host
from reference_trainers.config.schema import ConfigError, TrainConfig
from reference_trainers.envs.factory import open_vector_env
from reference_trainers.envs.episodes import EpisodeTracker
from reference_trainers.paths.learner import Learner, apply_process_settings, fell_back, maybe_compile
from reference_trainers.nets.networks import ActorCritic
from reference_trainers.paths.acting import choose_acting
from reference_trainers.ppo.loss import PPOLossCoefs, ppo_loss
from reference_trainers.ppo.policy import NumpyPPOActing, PPOPolicy, action_noise, evaluate_actions, sample_action
from reference_trainers.ppo.minibatches import choose_gather
from reference_trainers.ppo.rollout import choose_rollout
from reference_trainers.ppo.updates import choose_update
from reference_trainers.paths.prefetch import Prefetcher
from reference_trainers.runtime.probe import NullProbe, Probe
from reference_trainers.config.resolve import Resolution, resolve_config
from reference_trainers.paths.speedups import HostToDevice
from reference_trainers.runtime.trainer import IterationResult, train_from_command_line
from reference_trainers.state.trainer_state import Checkpointable

__all__ = ["PPOTrainer", "action_noise", "compute_gae", "compute_gae_fused", "evaluate_actions", "sample_action"]


# --------------------------------------------------------------------------- pure functions

def compute_gae(rewards: torch.Tensor, values: torch.Tensor, next_value: torch.Tensor, terminated: torch.Tensor,
                truncated: torch.Tensor, valid: torch.Tensor, gamma: float, lam: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over a (T, N) rollout.

    Terminated steps do not bootstrap; truncated steps bootstrap from the value of the
    final observation (under NEXT_STEP that is the next stored observation); both cut the
    GAE chain. Reset steps (``valid == 0``) get zero advantage.
    """
    steps = rewards.shape[0]
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(next_value)
    for t in reversed(range(steps)):
        delta = rewards[t] + gamma * next_values[t] * (1.0 - terminated[t]) - values[t]
        continues = (1.0 - terminated[t]) * (1.0 - truncated[t])
        running = (delta + gamma * lam * continues * running) * valid[t]
        advantages[t] = running
    return advantages, advantages + values


def compute_gae_fused(rewards: torch.Tensor, values: torch.Tensor, next_value: torch.Tensor,
                      terminated: torch.Tensor, truncated: torch.Tensor, valid: torch.Tensor, gamma: float,
                      lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``compute_gae`` with the TD errors and the chain coefficients computed for the whole
    rollout at once, leaving one multiply-add per time step (``fused_gae``): a fused torch op,
    or on the CPU two NumPy calls on views of the same tensors (a fraction of torch's dispatch)."""
    steps = rewards.shape[0]
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    not_terminated = 1.0 - terminated
    deltas = (rewards + gamma * next_values * not_terminated - values) * valid
    chain = gamma * lam * not_terminated * (1.0 - truncated) * valid
    advantages = torch.empty_like(rewards)
    if advantages.device.type == "cpu":
        _chain_on_host(deltas.numpy(), chain.numpy(), advantages.numpy())
    else:
        running = torch.zeros_like(next_value)
        for t in reversed(range(steps)):
            running = torch.addcmul(deltas[t], chain[t], running, out=advantages[t])
    return advantages, advantages + values


def _chain_on_host(deltas: np.ndarray, chain: np.ndarray, out: np.ndarray) -> None:
    """``out[t] = deltas[t] + chain[t] * out[t + 1]`` backwards from the last step (0 after it)."""
    running, scaled = np.zeros_like(deltas[0]), np.empty_like(deltas[0])
    for t in range(len(deltas) - 1, -1, -1):
        np.multiply(chain[t], running, out=scaled)
        running = np.add(deltas[t], scaled, out=out[t])


# --------------------------------------------------------------------------- trainer

class PPOTrainer(Checkpointable):
    """Build everything from a config; ``iterate()`` = one rollout + one update phase.

    ``state_dict()`` between iterations needs no rollout storage: ``collect`` rewrites all of it."""

    algo = "ppo"

    def __init__(self, config: TrainConfig, probe: Probe | None = None, resolution: Resolution | None = None) -> None:
        res = resolution or resolve_config(config)
        self.config, self.device, self.reasons = res.config, res.device, res.reasons
        self.probe: Probe = probe or NullProbe()
        c, o = self.config, self.config.optimizations
        distributed.join(c.distributed, self.device)
        seed = distributed.rank_seed(c.seed, c.env.num_envs)
        torch.manual_seed(c.seed)  # the network starts alike on every rank
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

        opened = open_vector_env(c.env, seed, c.model.body)
        self.envs, self.next_obs, self.num_envs = opened.envs, opened.next_obs, c.env.num_envs
        self.obs_dim, self.frames, self.obs_shape = opened.obs_dim, opened.frames, opened.obs_shape
        action_space = self.envs.single_action_space
        self.model = self.build_model(action_space).to(self.device)
        self.discrete = self.model.discrete
        if not self.discrete:
            self.action_low = action_space.low.astype(np.float32)
            self.action_high = action_space.high.astype(np.float32)

        # optimisations, each picking one path
        self.to_device = HostToDevice(self.device, pinned=o.pinned_memory, non_blocking=o.non_blocking,
                                      uint8=bool(o.uint8_transfer))
        self.prefetcher = Prefetcher(o.num_workers)
        self.loss_coefs = PPOLossCoefs(c.ppo.clip_coef, c.ppo.clip_vloss, c.ppo.ent_coef, c.ppo.vf_coef, c.ppo.norm_adv)
        self.aten_tanh_from = mlp.aten_tanh_from(c)  # aten_tanh: ATen's tanh on large activations of that step
        # update: autograd, hand-written (eager or compiled whole) or NumPy, chosen once; the learner's loss closure
        self.update_path = choose_update(self, o)
        self.learner = Learner(self.model, self.update_path, c, self.device, c.ppo.learning_rate, c.ppo.adam_eps,
                               sets_grads=self.update_path.sets_grads)
        self.forward = maybe_compile(self.learner.train_model, o)
        # acting: the policy, and the path that batches it (per sub-env, batched, or NumPy), chosen once
        self.policy = self.build_policy()
        self.inference_chunk = host.chunk_rows(o.batch_inference, o.inference_batch_size, self.num_envs)
        self.numpy_path = (NumpyPPOActing(self.policy, self.probe, self.inference_chunk,
                                          block_noise=bool(o.block_noise))
                           if o.numpy_acting else None)
        self.act = choose_acting(self.policy, self.num_envs, self.probe, o.batch_inference, o.inference_batch_size,
                                 self.numpy_path)
        self.rollout = choose_rollout(bool(o.lean_rollout))
        self.gae = compute_gae_fused if o.fused_gae else compute_gae
        # a minibatch's rows from the batch (host arrays for the NumPy update)
        self.gather_from = choose_gather(bool(o.packed_gather), bool(o.numpy_update))

        self.tracker = EpisodeTracker(self.num_envs, window=c.run.return_window)
        self.allocate_storage()
        self.env_steps = self.agent_steps = self.updates = self.iterations = 0
        self.last_stats: dict[str, float] = {}

    def build_model(self, action_space: gym.Space) -> nn.Module:
        """The feed-forward actor-critic (``recurrent_ppo.py`` builds a recurrent one)."""
        if self.config.model.recurrent != "none":
            raise ConfigError(f"model.recurrent: {self.config.model.recurrent!r} needs RecurrentPPOTrainer "
                              "(reference_trainers.build_trainer picks it); PPOTrainer accepts: none")
        return ActorCritic(self.obs_shape, action_space, self.config.model)

    def build_policy(self) -> PPOPolicy:
        """The torch acting policy the acting paths batch (the recurrent trainer carries hidden state)."""
        return PPOPolicy(self.model, self.forward, self.learner.autocast, self.to_device, self.generator, self.device,
                         self.num_envs, self.obs_shape, bool(self.config.optimizations.stacked_mlps))

    @property
    def nonfinite_events(self) -> int:
        return self.learner.nonfinite_events

    def rng_generators(self) -> dict[str, torch.Generator]:
        return {"sampling": self.generator}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        super().load_extra_state(state)
        self._drop_snapshots()  # the loaded weights replace those the acting snapshots were taken from

    # ----------------------------------------------------------------- storage
    def allocate_storage(self) -> None:
        T, N, d = self.config.ppo.num_steps, self.num_envs, self.device
        zeros = lambda *shape, dtype=torch.float32: torch.zeros(shape, dtype=dtype, device=d)  # noqa: E731
        # uint8 frames are stored as they arrive with uint8_transfer (float32 values 0..255 otherwise)
        obs_dtype = torch.uint8 if self.frames and self.config.optimizations.uint8_transfer else torch.float32
        self.obs_buf = zeros(T, N, *self.obs_shape, dtype=obs_dtype)
        self.actions_buf = zeros(T, N, dtype=torch.int64) if self.discrete else zeros(T, N, *self.model.log_std.shape)
        self.logprobs_buf, self.values_buf, self.rewards_buf = zeros(T, N), zeros(T, N), zeros(T, N)
        self.terminated_buf, self.truncated_buf, self.valid_buf = zeros(T, N), zeros(T, N), zeros(T, N)
        self.episode_over = np.zeros(N, dtype=bool)  # the next step of this sub-env is a reset step
        # lean_rollout: valid, rewards, terminated, truncated staged on the host, copied once per rollout
        self.host_scalars = np.zeros((4, T, N), dtype=np.float32)
        # lean_rollout with numpy_acting: the rollout's observations staged on the host, copied once per rollout
        staged_obs = self.rollout.stages_observations and self.numpy_path is not None
        self.host_obs = np.zeros((T, N, *self.obs_shape), dtype=np.float32) if staged_obs else None

    # ----------------------------------------------------------------- acting
    def _drop_snapshots(self) -> None:
        """Forget the acting snapshots (stacked torch network, NumPy forwards): the weights changed."""
        self.policy.drop_snapshot()
        if self.numpy_path is not None:
            self.numpy_path.drop_snapshot()

    def select_actions(self, obs: np.ndarray) -> np.ndarray:
        """One action selection for a batch of ``num_envs`` observations (host in, env-ready actions out)."""
        return self.env_actions(self.act(obs).host_actions)

    def env_actions(self, host_actions: np.ndarray) -> np.ndarray:
        if self.discrete:
            return host_actions.astype(np.int64, copy=False)
        return np.clip(host_actions, self.action_low, self.action_high)

    # ----------------------------------------------------------------- collect
    def collect(self) -> tuple[int, int]:
        """Fill the rollout storage; returns (env frames, agent steps)."""
        self._drop_snapshots()  # acting snapshots are taken afresh from the weights this rollout acts with
        if self.numpy_path is not None:  # block_noise: the rollout's acting draws, in the order its steps take them
            self.numpy_path.start_rollout(self.config.ppo.num_steps)
        try:
            return self.rollout.collect(self)
        finally:
            if self.numpy_path is not None:
                self.numpy_path.end_rollout()

    # ----------------------------------------------------------------- update
    def minibatch_loss(self, obs: torch.Tensor, actions: torch.Tensor, old_logprob: torch.Tensor,
                        advantages: torch.Tensor, returns: torch.Tensor, old_value: torch.Tensor,
                        mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The PPO loss of one minibatch (the learner adds backward, clipping and the step)."""
        with self.learner.autocast():
            actor_out, new_value = self.forward(obs)
        log_std = None if self.discrete else self.model.log_std
        new_logprob, entropy = evaluate_actions(actor_out, log_std, actions)
        return ppo_loss(new_logprob, entropy, new_value.float(), old_logprob, advantages, returns, old_value,
                        mask, self.loss_coefs)

    def _set_learning_rate(self) -> None:
        ppo = self.config.ppo
        if ppo.anneal_lr:  # on the env steps every rank agrees on (their resets differ), so the ranks step alike
            env_steps = distributed.agreed_min(self.env_steps)
            self.learner.set_learning_rate(ppo.learning_rate * max(0.0, 1.0 - env_steps / ppo.anneal_steps))

    def update(self) -> int:
        """GAE, then ``update_epochs`` passes of minibatch steps; returns optimiser steps taken."""
        c = self.config
        with self.probe.phase("inference"):
            next_obs = self.to_device.observations(self.next_obs.reshape(self.num_envs, *self.obs_shape), "obs")
            with torch.no_grad(), self.learner.autocast():
                next_value = self.policy.actor_critic(next_obs)[1].float()
        self._drop_snapshots()  # the update changes the weights
        with self.probe.phase("update"):
            self._set_learning_rate()
            advantages, returns = self.gae(self.rewards_buf, self.values_buf, next_value, self.terminated_buf,
                                           self.truncated_buf, self.valid_buf, c.ppo.gamma, c.ppo.gae_lambda)
            batch = (self.obs_buf.flatten(0, 1), self.actions_buf.flatten(0, 1), self.logprobs_buf.flatten(),
                     advantages.flatten(), returns.flatten(), self.values_buf.flatten(), self.valid_buf.flatten())
            size = batch[0].shape[0]
            minibatch = size // c.ppo.num_minibatches
            gather = self.gather_from(batch)
            steps = 0
            for _ in range(c.ppo.update_epochs):
                order = torch.randperm(size, generator=self.generator, device=self.device)
                chunks = (order[start:start + minibatch] for start in range(0, size, minibatch))
                # gathered inline, or ahead on background threads (num_workers) while earlier ones train
                for minibatch_tensors in self.prefetcher.map(gather, chunks):
                    self.learner.step(*minibatch_tensors)
                    steps += 1
        return steps

    # ----------------------------------------------------------------- loop
    def iterate(self) -> IterationResult:
        """One rollout and one update phase; returns what it did."""
        self.activate()
        frames, decisions = self.collect()
        updates = self.update()
        with self.probe.phase("logging"):
            self.last_stats = self.learner.flush(updates, self.iterations + 1)
        self.env_steps += frames
        self.agent_steps += decisions
        self.updates += updates
        self.iterations += 1
        return IterationResult(frames, decisions, updates)

    def activate(self) -> None:
        """Apply this trainer's process-wide settings (precision, threads) before it runs."""
        apply_process_settings(self.config.optimizations)

    @property
    def compile_fallback(self) -> bool:
        return fell_back(self.forward, self.learner.loss_and_grads, self.update_path.compiled)

    def mean_recent_return(self) -> float | None:
        return self.tracker.mean_recent()

    def close(self) -> None:
        self.prefetcher.close()
        self.envs.close()


def main(argv: list[str] | None = None) -> int:
    """Train PPO from a YAML config on its own (no harness): ``python -m reference_trainers.ppo.trainer``."""
    from reference_trainers import build_trainer

    return train_from_command_line(lambda config: build_trainer(resolve_config(config)), "policy_loss", argv,
                                   prog="python -m reference_trainers.ppo", description=main.__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
