"""Episode tracking: per-sub-env returns and lengths of a vector env's steps, and the recent mean."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch


class EpisodeTracker:
    """Per-sub-env running episode return and length, correct under NEXT_STEP autoreset.

    The step right after a sub-env's episode ends is its reset step: its reward is ignored and it is
    not counted into the next episode's length.
    """

    def __init__(self, num_envs: int, window: int = 20) -> None:
        if num_envs < 1 or window < 1:
            raise ValueError(f"num_envs and window must be >= 1, got {num_envs} and {window}")
        self.num_envs = int(num_envs)
        self._returns = np.zeros(self.num_envs, dtype=np.float32)
        self._lengths = np.zeros(self.num_envs, dtype=np.int64)
        self._resetting = np.zeros(self.num_envs, dtype=np.bool_)
        self._any_resetting = False  # some sub-env's next step is its reset step
        self._recent_returns: deque[float] = deque(maxlen=int(window))
        self._recent_lengths: deque[int] = deque(maxlen=int(window))
        self._completed = 0

    def update(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
               done: np.ndarray | None = None, any_done: bool | None = None) -> list[float]:
        """Account one vector step; return the returns of episodes that ended in it. ``done``
        (``terminated | truncated``) and ``any_done`` (``done.any()``): the caller's, if it has them."""
        rewards = np.asarray(rewards, dtype=np.float32).reshape(self.num_envs)
        if done is None:
            done = np.logical_or(terminated, truncated)
        done = done.reshape(self.num_envs)
        if any_done is None:
            any_done = bool(done.any())
        if not self._any_resetting and not any_done:  # most steps: every sub-env mid-episode
            self._returns += rewards
            self._lengths += 1
            return []
        live = ~self._resetting
        np.add(self._returns, rewards, out=self._returns, where=live)
        self._lengths += live
        ended = done & live
        self._resetting = ended
        self._any_resetting = bool(ended.any())
        if not self._any_resetting:
            return []
        finished = self._returns[ended].tolist()
        self._recent_returns.extend(finished)
        self._recent_lengths.extend(self._lengths[ended].tolist())
        self._completed += len(finished)
        self._returns[ended] = 0.0
        self._lengths[ended] = 0
        return finished

    def update_block(self, rewards: np.ndarray, done: np.ndarray) -> list[float]:
        """``update`` for a block of vector steps at once (rows in step order; ``done``:
        ``terminated | truncated``), with the same results: the steps where an episode ends, and
        the step after each, go through ``update``; the runs of steps between them, where every
        sub-env is mid-episode, add their rewards in one sequential accumulate and their lengths
        in one add (``lean_rollout``'s once-per-rollout accounting)."""
        rewards = np.asarray(rewards, dtype=np.float32).reshape(-1, self.num_envs)
        done = np.asarray(done, dtype=np.bool_).reshape(-1, self.num_envs)
        any_done = done.any(axis=1)
        events = any_done.copy()  # steps that end an episode, and the (reset) step after each
        events[1:] |= any_done[:-1]
        events[0] |= self._any_resetting
        finished: list[float] = []
        start = 0
        for step in [*np.flatnonzero(events).tolist(), len(rewards)]:
            if step > start:  # every sub-env mid-episode: the running returns, then each step's rewards, in order
                self._returns = np.add.accumulate(np.vstack([self._returns[None], rewards[start:step]]))[-1]
                self._lengths += step - start
            if step < len(rewards):
                finished += self.update(rewards[step], None, None, done=done[step], any_done=bool(any_done[step]))
            start = step + 1
        return finished

    def state_dict(self) -> dict[str, Any]:
        """Running and recent episode statistics, as tensors and lists (checkpoints)."""
        return {"returns": torch.from_numpy(self._returns.copy()), "lengths": torch.from_numpy(self._lengths.copy()),
                "resetting": torch.from_numpy(self._resetting.copy()), "recent_returns": list(self._recent_returns),
                "recent_lengths": list(self._recent_lengths), "completed": self._completed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._returns = state["returns"].numpy().copy()
        self._lengths = state["lengths"].numpy().copy()
        self._resetting = state["resetting"].numpy().copy()
        self._any_resetting = bool(self._resetting.any())
        self._recent_returns.clear()
        self._recent_returns.extend(state["recent_returns"])
        self._recent_lengths.clear()
        self._recent_lengths.extend(state["recent_lengths"])
        self._completed = int(state["completed"])

    @property
    def completed(self) -> int:
        """Number of episodes finished so far."""
        return self._completed

    def mean_recent(self) -> float | None:
        """Mean return of the last ``window`` completed episodes, or None if none yet."""
        return float(np.mean(self._recent_returns)) if self._recent_returns else None

    def mean_recent_length(self) -> float | None:
        """Mean length (env steps, reset steps excluded) of the last ``window`` completed episodes."""
        return float(np.mean(self._recent_lengths)) if self._recent_lengths else None
