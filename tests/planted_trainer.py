"""A small actor-critic trainer with speed problems planted behind switches (for ``rlgauge diagnose``).

``float64_rewards``: ``torch.tensor(reward)`` of gymnasium's float64 rewards (a float64 op);
``item_per_env``: an ``.item()`` per env per step (a host sync per env step);
``per_env_forward``: one policy forward per env instead of one per vector step.
With every switch off it is the clean trainer: none of those findings.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

PLANTED = ("float64_rewards", "item_per_env", "per_env_forward")


class Planted:
    def __init__(self, config: dict, device: str, seed: int) -> None:
        unknown = sorted(set(config) - {"num_envs", "num_steps", *PLANTED})
        if unknown:
            raise ValueError(f"unknown keys {unknown}")
        self.num_envs, self.num_steps = config.get("num_envs", 4), config.get("num_steps", 16)
        self.plant = {name: bool(config.get(name)) for name in PLANTED}
        torch.manual_seed(seed)
        self.envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(self.num_envs)])
        self.obs, _ = self.envs.reset(seed=seed)
        self.policy = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=1e-3)
        self.total_reward = 0.0

    def _act(self, obs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if self.plant["per_env_forward"]:
                logits = torch.cat([self.policy(obs[i:i + 1]) for i in range(self.num_envs)])
            else:
                logits = self.policy(obs)
        return torch.distributions.Categorical(logits=logits).sample()

    def iterate(self) -> int:
        observations, actions, rewards = [], [], []
        for _ in range(self.num_steps):
            obs = torch.tensor(self.obs, dtype=torch.float32)
            action = self._act(obs)
            self.obs, reward, terminated, truncated, _ = self.envs.step(action.numpy())
            if self.plant["float64_rewards"]:
                reward_t = torch.tensor(reward)  # float64: gymnasium's rewards are float64
            else:
                reward_t = torch.tensor(reward, dtype=torch.float32)
            if self.plant["item_per_env"]:
                for i in range(self.num_envs):
                    self.total_reward += reward_t[i].item()
            observations.append(obs)
            actions.append(action)
            rewards.append(reward_t.float())
        obs_b, act_b, rew_b = torch.stack(observations), torch.stack(actions), torch.stack(rewards)
        logp = torch.distributions.Categorical(logits=self.policy(obs_b)).log_prob(act_b)
        loss = -(logp * (rew_b - rew_b.mean())).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return self.num_envs * self.num_steps

    def close(self) -> None:
        self.envs.close()


def make_trainer(config: dict, *, device: str, seed: int) -> Planted:
    return Planted(config, device, seed)


def planted_line(text: str) -> int:
    """The line number in this file of the first line containing ``text``."""
    with open(__file__, encoding="utf-8") as handle:
        return next(n for n, line in enumerate(handle, 1) if text in line)


_ = np  # numpy is gymnasium's: imported so a reader sees where the float64 rewards come from
