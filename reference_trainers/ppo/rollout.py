"""PPO's rollout paths, chosen once from ``lean_rollout``: the plain one writes every step's tensors to the
rollout storage as they come; the lean one stages them on the host and writes the storage once a rollout.
Each fills the trainer's storage (``PPOTrainer.allocate_storage``) and returns (env frames, agent steps)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from reference_trainers.envs.factory import frames_in_step

if TYPE_CHECKING:
    from reference_trainers.ppo.trainer import PPOTrainer


class PlainRollout:
    stages_observations = False
    """Whether observations acted on in NumPy are staged on the host (``PPOTrainer.host_obs``)."""

    def collect(self, trainer: PPOTrainer) -> tuple[int, int]:
        """Plain path: every step's tensors cross to the device and are written to storage as they come."""
        probe, frames = trainer.probe, 0
        for t in range(trainer.config.ppo.num_steps):
            with probe.phase("transfer"):
                trainer.valid_buf[t] = trainer.to_device(~trainer.episode_over, "valid")
            obs_t, (action, logprob, value), host_actions = trainer.act(trainer.next_obs)
            trainer.obs_buf[t] = torch.as_tensor(obs_t)  # numpy_acting hands back host arrays
            trainer.actions_buf[t] = torch.as_tensor(action)
            trainer.logprobs_buf[t] = torch.as_tensor(logprob)
            trainer.values_buf[t] = torch.as_tensor(value)
            with probe.phase("env"):
                actions_for_env = trainer.env_actions(host_actions)
                trainer.next_obs, reward, terminated, truncated, info = trainer.envs.step(actions_for_env)
            with probe.phase("transfer"):
                flags = trainer.to_device(np.stack([reward, terminated, truncated]), "flags")
                trainer.rewards_buf[t], trainer.terminated_buf[t], trainer.truncated_buf[t] = flags
            with probe.phase("logging"):
                frames += frames_in_step(info, trainer.num_envs, trainer.episode_over)
                trainer.tracker.update(reward, terminated, truncated)
                trainer.episode_over = terminated | truncated
        return frames, trainer.config.ppo.num_steps * trainer.num_envs


class LeanRollout:
    stages_observations = True

    def collect(self, trainer: PPOTrainer) -> tuple[int, int]:
        """Optimised path (``lean_rollout``): the storage is written once per rollout, not per step.
        The reset mask, rewards and done flags go to a host array that crosses once; actions,
        log-probabilities and values are stacked once at the end (with ``numpy_acting`` they and the
        observations are host arrays, staged on the host and copied once each). Episodes and
        transitions are counted once per rollout from the staged arrays. Acting is the plain
        collect's: ``act`` decides the forward."""
        probe, frames, steps = trainer.probe, 0, trainer.config.ppo.num_steps
        host = trainer.host_scalars
        actions, logprobs, values = [], [], []
        host_obs = trainer.host_obs
        framed: list[int] = []  # steps whose info reports frames (action repeat); the others count their valid rows
        for t in range(steps):
            host[0, t] = ~trainer.episode_over
            obs_t, (action, logprob, value), host_actions = trainer.act(trainer.next_obs)
            if trainer.numpy_path is not None:  # a copy: a vector env may hand back the same array each step
                host_obs[t] = obs_t
            else:
                trainer.obs_buf[t] = obs_t
            actions.append(action)
            logprobs.append(logprob)
            values.append(value)
            with probe.phase("env"):
                actions_for_env = trainer.env_actions(host_actions)
                trainer.next_obs, reward, terminated, truncated, info = trainer.envs.step(actions_for_env)
            with probe.phase("logging"):
                host[1, t], host[2, t], host[3, t] = reward, terminated, truncated
                if "frames" in info:
                    frames += frames_in_step(info, trainer.num_envs, trainer.episode_over)
                    framed.append(t)
                trainer.episode_over = terminated | truncated
        with probe.phase("logging"):  # episodes and transitions of the whole rollout, from the staged arrays
            frames += int(np.count_nonzero(host[0])) - int(np.count_nonzero(host[0, framed]))
            trainer.tracker.update_block(host[1], (host[2] + host[3]) > 0)
        with probe.phase("transfer"):
            scalars = trainer.to_device(host, "rollout_scalars")
            stores = (trainer.valid_buf, trainer.rewards_buf, trainer.terminated_buf, trainer.truncated_buf)
            for store, rows in zip(stores, scalars):
                store.copy_(rows)
            if trainer.numpy_path is not None:  # the whole rollout's host arrays, one copy each
                trainer.obs_buf.copy_(torch.from_numpy(host_obs))
                for store, rows in ((trainer.actions_buf, actions), (trainer.logprobs_buf, logprobs),
                                    (trainer.values_buf, values)):
                    store.copy_(torch.from_numpy(np.stack(rows)))
            else:
                torch.stack(actions, out=trainer.actions_buf)
                torch.stack(logprobs, out=trainer.logprobs_buf)
                torch.stack(values, out=trainer.values_buf)
        return frames, steps * trainer.num_envs


def choose_rollout(lean: bool) -> PlainRollout | LeanRollout:
    """The rollout path of ``lean_rollout``."""
    return LeanRollout() if lean else PlainRollout()
