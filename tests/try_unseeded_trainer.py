"""A generator trainer for the tests of ``rlgauge try``'s seed audit: its env's first reset has no seed
(``reset_seed: false``), and torch's generator is seeded from the OS's entropy with ``torch_from_entropy: true``
(left alone, it starts from torch's fixed default seed, the same in every process). Every step is yielded; a
linear policy learns by a gradient step on each step's return."""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn


def make_trainer(config: dict, *, device: str, seed: int):  # noqa: ANN201 - a generator
    if config.get("torch_from_entropy"):
        torch.seed()
    else:
        torch.manual_seed(seed)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
    policy = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.01)
    obs, _ = envs.reset(seed=seed) if config.get("reset_seed", True) else envs.reset()
    while True:
        logits = policy(torch.as_tensor(obs, dtype=torch.float32))
        action = logits.argmax(-1)
        obs, reward, _terminated, _truncated, _info = envs.step(action.numpy())
        loss = -(logits.log_softmax(-1).gather(1, action[:, None]).squeeze(1)
                 * torch.as_tensor(reward, dtype=torch.float32)).mean() + 0.01 * logits.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        yield 2
