"""Two small trainers whose network method serves both acting and the update (``get_action(x, action=None)``,
CleanRL's shape): ``shared`` acts with a graph nobody uses; ``reinforce`` keeps the acting log-probs and
backpropagates through them, so its acting graph is used."""

from __future__ import annotations

from typing import Iterator

import gymnasium as gym
import torch


class Agent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.actor = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))

    def get_action(self, x: torch.Tensor, action: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        dist = torch.distributions.Categorical(logits=self.actor(x), validate_args=False)  # the method's forward
        action = dist.sample() if action is None else action
        return action, dist.log_prob(action)


def make_trainer(config: dict | None = None, *, device: str = "cpu", seed: int = 0) -> Iterator[int]:
    reinforce = bool((config or {}).get("reinforce", False))
    torch.manual_seed(seed)
    env = gym.make("CartPole-v1")
    agent = Agent()
    optimizer = torch.optim.SGD(agent.parameters(), lr=1e-3)
    obs_np, _ = env.reset(seed=seed)
    while True:
        observations, actions, logps = [], [], []
        for _ in range(8):
            obs = torch.as_tensor(obs_np, dtype=torch.float32)
            action, logp = agent.get_action(obs)  # the acting call in the loop
            obs_np, _, terminated, truncated, _ = env.step(int(action))
            if terminated or truncated:
                obs_np, _ = env.reset()
            observations.append(obs)
            actions.append(action)
            logps.append(logp)
        optimizer.zero_grad()
        if reinforce:
            loss = -torch.stack(logps).sum()
        else:
            _, new_logp = agent.get_action(torch.stack(observations), torch.stack(actions))  # the update's call
            loss = -new_logp.sum()
        loss.backward()
        optimizer.step()
        yield 8
