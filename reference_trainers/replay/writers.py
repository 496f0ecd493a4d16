"""Transition writers: turn each vector-env step into the replay transitions it completes.

A transition is ``(obs, action, return, next_obs, bootstrap)``: the TD target is
``return + bootstrap * V(next_obs)``, where ``bootstrap`` is ``gamma ** m`` for an m-step
return that may continue and 0 after a termination. Truncation (a time limit) is not a
termination: it ends the return but still bootstraps from the final observation.

Steps marked invalid (under NEXT_STEP autoreset, the step after an episode ended returns
the reset observation: no real transition) are never written.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch


class TransitionBatch(NamedTuple):
    """Host-side transitions, float32 (actions int64; uint8 pixel observations stay uint8), ready for one replay insert."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    bootstrap: np.ndarray

    def __len__(self) -> int:  # type: ignore[override] - the number of transitions, not of fields
        return int(self.actions.shape[0])


def _float32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _observations(x: np.ndarray) -> np.ndarray:
    """uint8 pixels keep their dtype (a quarter of float32's memory); anything else becomes float32."""
    x = np.asarray(x)
    return x if x.dtype == np.uint8 else x.astype(np.float32, copy=False)


class OneStepWriter:
    """Plain path (``n_step: 1``): every valid step is one transition, ``bootstrap = gamma * (1 - terminated)``."""

    def __init__(self, num_envs: int, gamma: float) -> None:
        self.num_envs = num_envs
        self.gamma = np.float32(gamma)

    def push(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray,
             terminated: np.ndarray, truncated: np.ndarray, valid: np.ndarray) -> TransitionBatch:
        """This step's transitions; the batch may view the arrays given (replay copies what it stores)."""
        if valid.all():  # no reset step among them: every row as it is
            bootstrap = self.gamma * ~terminated  # float32: gamma where the episode goes on, else 0
            return TransitionBatch(_observations(obs), np.asarray(actions, dtype=np.int64), _float32(rewards),
                                   _observations(next_obs), bootstrap)
        keep = np.flatnonzero(valid)
        bootstrap = np.where(terminated[keep], np.float32(0.0), self.gamma).astype(np.float32)
        return TransitionBatch(_observations(obs)[keep], np.asarray(actions, dtype=np.int64)[keep],
                               _float32(rewards)[keep], _observations(next_obs)[keep], bootstrap)

    def state_dict(self) -> dict[str, Any]:
        """A one-step writer holds nothing between steps."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see ``state_dict``)."""


class NStepWriter:
    """The chunked n-step writer: all sub-envs at once, one batch of finished transitions per step.

    Each sub-env keeps its last ``n`` valid steps. When it holds ``n`` steps, the oldest
    becomes a transition with the n-step return and ``bootstrap = gamma ** n``. When an
    episode ends, every pending step becomes a transition at once (shorter returns, up to
    the final observation), with ``bootstrap = 0`` after a termination and ``gamma ** m``
    after a truncation. Guarded by the brute-force comparison in tests/test_nstep.py.
    """

    def __init__(self, num_envs: int, gamma: float, n: int, obs_shape: tuple[int, ...],
                 obs_dtype: type = np.float32) -> None:
        self.num_envs, self.n = num_envs, n
        powers = gamma ** np.arange(n + 1, dtype=np.float64)  # host numpy, cast below: never a tensor
        self.gamma_powers = powers.astype(np.float32)
        k, j = np.meshgrid(np.arange(n), np.arange(n))
        # discounts[j, k] = gamma ** (k - j) for k >= j: the return from slot j sums slots j..
        self.discounts = np.where(k >= j, powers[np.clip(k - j, 0, n)], 0.0).astype(np.float32)
        self.obs = np.zeros((num_envs, n, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((num_envs, n), dtype=np.int64)
        self.rewards = np.zeros((num_envs, n), dtype=np.float32)
        self.count = np.zeros(num_envs, dtype=np.int64)

    def push(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray,
             terminated: np.ndarray, truncated: np.ndarray, valid: np.ndarray) -> TransitionBatch:
        next_obs = _observations(next_obs)
        live = np.flatnonzero(valid)
        slot = self.count[live]
        self.obs[live, slot] = _observations(obs)[live]
        self.actions[live, slot] = np.asarray(actions, dtype=np.int64)[live]
        self.rewards[live, slot] = _float32(rewards)[live]
        self.count[live] += 1
        ended = np.asarray(valid) & (np.asarray(terminated) | np.asarray(truncated))
        full = np.asarray(valid) & ~ended & (self.count == self.n)
        parts = [self._pop_oldest(np.flatnonzero(full), next_obs),
                 self._flush(np.flatnonzero(ended), next_obs, np.asarray(terminated))]
        return TransitionBatch(*(np.concatenate(fields) for fields in zip(*parts)))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The pending (not yet written) steps of every sub-env."""
        return {name: torch.from_numpy(getattr(self, name).copy()) for name in ("obs", "actions", "rewards", "count")}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name in ("obs", "actions", "rewards", "count"):
            getattr(self, name)[...] = state[name].numpy()

    def _pop_oldest(self, envs: np.ndarray, next_obs: np.ndarray) -> TransitionBatch:
        """Sub-envs holding n steps: emit the oldest with the full n-step return, then shift."""
        returns = self.rewards[envs] @ self.gamma_powers[:self.n]
        out = TransitionBatch(self.obs[envs, 0], self.actions[envs, 0], returns.astype(np.float32), next_obs[envs],
                              np.full(len(envs), self.gamma_powers[self.n], dtype=np.float32))
        for store in (self.obs, self.actions, self.rewards):
            store[envs, :-1] = store[envs, 1:]
        self.count[envs] -= 1
        return out

    def _flush(self, envs: np.ndarray, next_obs: np.ndarray, terminated: np.ndarray) -> TransitionBatch:
        """Sub-envs whose episode ended: emit every pending step (returns cut at the episode end)."""
        counts = self.count[envs]
        pending = np.arange(self.n)[None, :] < counts[:, None]           # (envs, n)
        returns = (self.rewards[envs] * pending) @ self.discounts.T      # returns[e, j] = sum_k>=j gamma^(k-j) r_k
        steps_left = np.clip(counts[:, None] - np.arange(self.n)[None, :], 0, self.n)
        bootstrap = np.where(terminated[envs][:, None], np.float32(0.0), self.gamma_powers[steps_left])
        out = TransitionBatch(self.obs[envs][pending], self.actions[envs][pending],
                              returns[pending].astype(np.float32), np.repeat(next_obs[envs], counts, axis=0),
                              bootstrap[pending].astype(np.float32))
        self.count[envs] = 0
        return out


def make_writer(num_envs: int, gamma: float, n_step: int, obs_shape: tuple[int, ...],
                obs_dtype: type = np.float32) -> OneStepWriter | NStepWriter:
    """``n_step: 1`` -> the plain one-step writer; ``n_step > 1`` -> the chunked n-step writer."""
    return (OneStepWriter(num_envs, gamma) if n_step == 1
            else NStepWriter(num_envs, gamma, n_step, obs_shape, obs_dtype))
