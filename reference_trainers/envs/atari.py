"""Atari through ale-py: registering the ``ALE/...`` ids and the standard preprocessing per sub-env.

``ale-py`` is optional (``pip install rlgauge[atari]``; its wheels ship the ROMs). The
preprocessing is gymnasium's own: ``AtariPreprocessing`` (no-op starts, frame skip with a
max over the last two frames, grey, square resize) on a base env built with
``frameskip=1``, optional sign clipping of rewards, then ``FrameStackObservation``.
Observations are uint8 arrays of shape (stack, screen_size, screen_size).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

INSTALL_HINT = "pip install rlgauge[atari]"


@dataclass(frozen=True)
class AtariSettings:
    """The ``env.atari`` block as plain values (picklable for subprocess sub-envs)."""

    frame_skip: int = 4
    screen_size: int = 84
    stack: int = 4
    noop_max: int = 30
    terminal_on_life_loss: bool = False
    reward_clip: bool = True


def looks_like_atari(env_id: str) -> bool:
    """``ALE/Pong-v5`` or the legacy ``PongNoFrameskip-v4`` style."""
    name = env_id.partition(":")[2] or env_id
    return name.startswith("ALE/") or "NoFrameskip" in name


def ale_available() -> bool:
    return importlib.util.find_spec("ale_py") is not None


def register_atari_envs() -> bool:
    """Register ale-py's ids with gymnasium if ale-py is installed; whether it is."""
    if not ale_available():
        return False
    import ale_py

    gym.register_envs(ale_py)
    return True


def is_ale_env(env_id: str) -> bool:
    """Whether the registered ``env_id`` is an ALE env (its entry point lives in ale_py)."""
    name = env_id.partition(":")[2] or env_id
    spec = gym.registry.get(name)
    entry = getattr(spec, "entry_point", None)
    return isinstance(entry, str) and entry.startswith("ale_py")


class _FrameCounter(gym.Wrapper):
    """Counts the emulator steps taken through it (below the frame-skipping wrapper)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.frames = 0

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        self.frames += 1
        return self.env.step(action)


class _ReportFrames(gym.Wrapper):
    """``info['frames']``: emulator frames of the last step (0 in the reset info, so a NEXT_STEP
    reset step counts no frames; no-op starts are part of the reset, not counted)."""

    def __init__(self, env: gym.Env, counter: _FrameCounter) -> None:
        super().__init__(env)
        self._counter = counter
        self._seen = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._seen = self._counter.frames
        return obs, {**info, "frames": 0}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        frames, self._seen = self._counter.frames - self._seen, self._counter.frames
        return obs, reward, terminated, truncated, {**info, "frames": frames}


def make_atari_env(env_id: str, settings: AtariSettings, env_kwargs: dict[str, Any]) -> gym.Env:
    """One preprocessed Atari env: ``gym.make(env_id, frameskip=1, **env_kwargs)`` wrapped as above."""
    from gymnasium.wrappers import AtariPreprocessing, ClipReward, FrameStackObservation

    register_atari_envs()
    base = _FrameCounter(gym.make(env_id, **{**env_kwargs, "frameskip": 1}))
    env: gym.Env = AtariPreprocessing(base, noop_max=settings.noop_max, frame_skip=settings.frame_skip,
                                      screen_size=settings.screen_size,
                                      terminal_on_life_loss=settings.terminal_on_life_loss,
                                      grayscale_obs=True, scale_obs=False)
    if settings.reward_clip:
        env = ClipReward(env, -1.0, 1.0)  # Atari rewards are integers: clipping is the sign
    env = FrameStackObservation(env, settings.stack)
    return _ReportFrames(env, base)


def is_image_space(space: gym.Space) -> bool:
    """A uint8 Box of shape (channels, height, width), channels first (fewer channels than
    pixels a side, so a raw (210, 160, 3) Atari screen is not taken for 210 channels): what the
    Nature CNN takes."""
    return (isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8
            and space.shape[0] < min(space.shape[1:]))
