"""A small actor-critic trainer with speed problems planted behind switches (for ``rlgauge diagnose``).

``float64_rewards``: ``torch.tensor(reward)`` of gymnasium's float64 rewards (a float64 op);
``item_per_env``: an ``.item()`` per env per step (a host sync per env step);
``per_env_forward``: one policy forward per env instead of one per vector step;
``per_env_acting``: actions chosen env by env: a forward of each env's 1-D observation and an
``.item()`` of its argmax.
With every switch off it is the clean trainer: none of those findings.

``make_dqn_like``: a DQN-style generator that yields every env step and updates every
``train_frequency``-th, acting without ``no_grad`` (a graph nobody uses) and taking its target
network's forward under ``no_grad`` inside the update.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

PLANTED = ("float64_rewards", "item_per_env", "per_env_forward", "per_env_acting")


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
        if self.plant["per_env_acting"]:
            with torch.no_grad():
                chosen = []
                for i in range(self.num_envs):
                    logits_i = self.policy(obs[i])  # per-env forward of a 1-D observation
                    chosen.append(int(torch.argmax(logits_i).item()))  # per-env action sync
            return torch.tensor(chosen)
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


def make_dqn_like(config: dict | None = None, *, device: str | None = None, seed: int | None = None):
    """A generator trainer: one env step per ``next()``, an update every ``train_frequency``-th."""
    config = config or {}
    train_frequency = config.get("train_frequency", 10)
    torch.manual_seed(seed or 0)
    env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    q_network = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    target_network = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(q_network.parameters(), lr=1e-3)
    obs, _ = env.reset(seed=seed)
    memory: list[tuple[np.ndarray, int, float, np.ndarray]] = []
    step = 0
    while True:
        q_values = q_network(torch.tensor(obs, dtype=torch.float32))  # acting without no_grad
        actions = torch.argmax(q_values, dim=1).cpu().numpy()
        next_obs, reward, _, _, _ = env.step(actions)
        memory.append((obs[0], int(actions[0]), float(reward[0]), next_obs[0]))
        obs = next_obs
        step += 1
        if step % train_frequency == 0:
            batch = memory[-32:]
            o = torch.tensor(np.stack([b[0] for b in batch]), dtype=torch.float32)
            a = torch.tensor([b[1] for b in batch])
            r = torch.tensor([b[2] for b in batch], dtype=torch.float32)
            o2 = torch.tensor(np.stack([b[3] for b in batch]), dtype=torch.float32)
            with torch.no_grad():
                target = r + 0.99 * target_network(o2).max(dim=1).values  # target forward: the update's
            loss = ((q_network(o).gather(1, a[:, None]).squeeze(1) - target) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        yield 1


def planted_line(text: str) -> int:
    """The line number in this file of the first line containing ``text``."""
    with open(__file__, encoding="utf-8") as handle:
        return next(n for n, line in enumerate(handle, 1) if text in line)


_ = np  # numpy is gymnasium's: imported so a reader sees where the float64 rewards come from
