"""Partially observed tasks for recurrent policies: CartPole with its velocities masked.

``CartPoleNoVel-v1`` is CartPole-v1 observing only the cart position and the pole angle, so
a policy must infer velocities from the history: a feed-forward policy stalls where a
recurrent one learns. Registered with gymnasium when ``reference_trainers.envs.factory`` is
imported, so every vectorisation backend (and asynchronous workers) can build it by id.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv

CARTPOLE_NO_VELOCITY_ID = "CartPoleNoVel-v1"
_KEPT = np.array([0, 2])  # cart position, pole angle (velocities 1 and 3 are dropped)


class MaskVelocity(gym.ObservationWrapper):
    """Keep only the position entries of CartPole's observation, as float32."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low[_KEPT], space.high[_KEPT], dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[_KEPT].astype(np.float32)


def make_cartpole_no_velocity(**kwargs: object) -> gym.Env:
    return MaskVelocity(CartPoleEnv(**kwargs))


def register() -> None:
    """Register the partially observed envs (idempotent)."""
    if CARTPOLE_NO_VELOCITY_ID not in gym.registry:
        gym.register(id=CARTPOLE_NO_VELOCITY_ID, entry_point=make_cartpole_no_velocity, max_episode_steps=500,
                     reward_threshold=475.0)
