"""A tiny synthetic image env for fast pixel tests: ``pixel_env:PixelDot-v0``.

Observations are uint8 (2, 36, 36) frames (the smallest the Nature CNN takes): seeded noise
plus a bright dot that the three actions move left, stay or right. Reward 1 while the dot is in
the centre columns; episodes terminate after 12 steps.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

SIDE = 36


class PixelDot(gym.Env):
    observation_space = gym.spaces.Box(0, 255, (2, SIDE, SIDE), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.pos = self.np_random.integers(0, SIDE, size=2)
        self.t = 0
        return self._frame(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.pos[1] = np.clip(self.pos[1] + int(action) - 1, 0, SIDE - 1)
        self.t += 1
        reward = float(abs(int(self.pos[1]) - SIDE // 2) < 4)
        return self._frame(), reward, self.t >= 12, False, {}

    def _frame(self) -> np.ndarray:
        frame = self.np_random.integers(0, 64, size=(2, SIDE, SIDE), dtype=np.uint8)
        frame[:, self.pos[0], self.pos[1]] = 255
        return frame


if "PixelDot-v0" not in gym.registry:
    gym.register("PixelDot-v0", entry_point=PixelDot)

PIXEL_ENV = "pixel_env:PixelDot-v0"
