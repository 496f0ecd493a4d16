"""Environments that fail on purpose, registered on import (``env.id: faulty_envs:FailingCartPole-v0``)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class FailingCartPole(CartPoleEnv):
    """CartPole whose copy first reset with seed ``fail_seed`` raises at its ``fail_at_step``-th step
    (vector envs seed sub-env i with ``seed + i``, so the seed picks the failing sub-env)."""

    def __init__(self, fail_at_step: int = 10, fail_seed: int = 2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_at_step, self.fail_seed = fail_at_step, fail_seed
        self.first_seed: int | None = None
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if self.first_seed is None:
            self.first_seed = seed
        return super().reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.first_seed == self.fail_seed and self.steps >= self.fail_at_step:
            raise ValueError(f"planted failure at step {self.steps}\nsecond line")
        return super().step(action)


if "FailingCartPole-v0" not in gym.registry:
    gym.register("FailingCartPole-v0", entry_point=FailingCartPole, max_episode_steps=500)
