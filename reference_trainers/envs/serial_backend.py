"""The serial vector backend: a Python list of single envs stepped one at a time in this process.

It follows SyncVectorEnv's NEXT_STEP autoreset semantics without its per-step space dispatch, so the
``serial`` and ``sync`` modes differ only in how the batch is built (see ``envs.make_vector_env``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Discrete, MultiBinary, MultiDiscrete
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

ARRAY_SPACES = (Box, Discrete, MultiBinary, MultiDiscrete)
"""Spaces whose samples are NumPy arrays (or scalars), batched along a new first axis."""


class SerialVectorEnv(gym.vector.VectorEnv):
    """A Python list of single envs stepped one at a time, with SyncVectorEnv's NEXT_STEP semantics.

    ``reset(seed=s)`` seeds sub-env ``i`` with ``s + i``; a finished sub-env is reset without a seed on
    the following step (reward 0, not done, action ignored). Infos are aggregated with ``_add_info``.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]]) -> None:
        super().__init__()
        self.envs: list[gym.Env] = [fn() for fn in env_fns]
        if not self.envs:
            raise ValueError("SerialVectorEnv needs at least one env")
        first = self.envs[0]
        self.num_envs = len(self.envs)
        self.metadata = {**first.metadata, "autoreset_mode": AutoresetMode.NEXT_STEP}
        self.render_mode = first.render_mode
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._needs_reset = np.zeros(self.num_envs, dtype=np.bool_)
        # array spaces (Box, Discrete, ...) batch as one np.stack and index actions directly;
        # composite ones (Dict, Tuple) go through gymnasium's space utilities
        self._array_observations = isinstance(self.single_observation_space, ARRAY_SPACES)
        self._array_actions = isinstance(self.single_action_space, ARRAY_SPACES)

    def _batch(self, observations: list[Any]) -> Any:
        space = self.single_observation_space
        if self._array_observations:  # what concatenate does for them, without its dispatch
            out = np.empty((self.num_envs, *space.shape), dtype=space.dtype)
            return np.stack(observations, axis=0, out=out)
        return concatenate(space, observations, create_empty_array(space, n=self.num_envs, fn=np.zeros))

    def _per_env_actions(self, actions: Any) -> Any:
        """Sub-env ``i``'s action is ``actions[i]`` for an array batch, else gymnasium's ``iterate``."""
        if self._array_actions and isinstance(actions, np.ndarray):
            return actions
        return list(iterate(self.action_space, actions))

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} seeds, got {len(seeds)}")
        observations, infos = [], {}
        for i, (env, env_seed) in enumerate(zip(self.envs, seeds)):
            obs, info = env.reset(seed=env_seed, options=options)
            observations.append(obs)
            infos = self._add_info(infos, info, i)
        self._needs_reset[:] = False
        return self._batch(observations), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=np.bool_)
        truncated = np.zeros(self.num_envs, dtype=np.bool_)
        space, infos = self.single_observation_space, {}
        # array spaces: each observation written straight into the batch (what np.stack does, without the list)
        observations: Any = (np.empty((self.num_envs, *space.shape), dtype=space.dtype) if self._array_observations
                             else [])
        for i, (env, action) in enumerate(zip(self.envs, self._per_env_actions(actions))):
            if self._needs_reset[i]:
                obs, info = env.reset()
            else:
                obs, rewards[i], terminated[i], truncated[i], info = env.step(action)
            if self._array_observations:
                observations[i] = obs
            else:
                observations.append(obs)
            if info:
                infos = self._add_info(infos, info, i)
        self._needs_reset = terminated | truncated
        if not self._array_observations:
            observations = self._batch(observations)
        return observations, rewards, terminated, truncated, infos

    def render(self) -> tuple[Any, ...]:
        return tuple(env.render() for env in self.envs)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call (or read, if not callable) attribute ``name`` on every sub-env."""
        attrs = [env.get_wrapper_attr(name) for env in self.envs]
        return tuple(a(*args, **kwargs) if callable(a) else a for a in attrs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Read attribute ``name`` from every sub-env."""
        return tuple(env.get_wrapper_attr(name) for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()
