"""A small trainer that compiles its acting call and its update (LeanRL's shape), for the diagnosis tests.

``backend`` (default ``eager``: dynamo's tracing, guards and graph breaks without a C++ compile)
is torch.compile's backend. The update breaks its graph at ``zero_grad`` and ``backward``.
"""

from __future__ import annotations

from typing import Any, Iterator

import gymnasium as gym
import torch


def make_trainer(config: dict | None = None, *, device: str = "cpu", seed: int = 0) -> Iterator[int]:
    config = dict(config or {})
    backend, num_steps = config.get("backend", "eager"), int(config.get("num_steps", 16))
    torch.manual_seed(seed)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    def act(obs: torch.Tensor) -> torch.Tensor:
        return net(obs).argmax(-1)

    def update(obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(obs), actions)
        loss.backward()
        optimizer.step()
        return loss.detach()

    if backend == "failing":  # a compiler that fails: the trainer's compile raises at its first call
        def backend(graph: Any, inputs: Any) -> Any:
            raise RuntimeError("no C++ compiler found")

    policy = torch.compile(act, backend=backend)
    update = torch.compile(update, backend=backend)
    obs_np, _ = envs.reset(seed=seed)
    while True:
        observations, actions = [], []
        for _ in range(num_steps):
            obs = torch.as_tensor(obs_np, dtype=torch.float32)
            with torch.no_grad():
                action = policy(obs)  # the acting call
            obs_np, _, _, _, _ = envs.step(action.numpy())
            observations.append(obs)
            actions.append(action)
        update(torch.cat(observations), torch.cat(actions))
        yield num_steps * 2
