"""The ``envpool`` vectorization backend: EnvPool's C++ thread pool behind gymnasium's VectorEnv API.

EnvPool is optional (``pip install rlgauge[envpool]``). It provides Atari (``ALE/Pong-v5`` and
``PongNoFrameskip-v4`` map to its ``Pong-v5``, preprocessed in C++ from the ``env.atari``
block: frame skip, max-pool, grey, resize, no-op starts, sign clipping, frame stack; no fire
reset, no episodic life) and the classic-control envs under their gymnasium ids.

Autoreset: EnvPool (1.x, gymnasium API) already follows NEXT_STEP: the step after a sub-env's
episode ends returns its reset observation with reward 0, not done, and ignores the action
(``info['elapsed_step'] == 0``). The adapter keeps that and adds ``info['frames']`` (emulator
frames per sub-env, 0 on reset steps), so replay and GAE never store the reset step.
Sub-env ``i`` is seeded with ``seed + i`` by EnvPool itself.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

if TYPE_CHECKING:
    from reference_trainers.envs.atari import AtariSettings

INSTALL_HINT = "envpool is not installed: pip install rlgauge[envpool]"


def envpool_available() -> bool:
    return importlib.util.find_spec("envpool") is not None


def envpool_task(env_id: str) -> str:
    """EnvPool's id for a gymnasium id: ``ALE/Pong-v5`` / ``PongNoFrameskip-v4`` -> ``Pong-v5``."""
    name = env_id.partition(":")[2] or env_id
    if name.startswith("ALE/"):
        return name.removeprefix("ALE/")
    if "NoFrameskip" in name:
        return name.split("NoFrameskip")[0] + "-v5"
    return name


def _is_atari_task(env_id: str) -> bool:
    name = env_id.partition(":")[2] or env_id
    return name.startswith("ALE/") or "NoFrameskip" in name


def envpool_status(env_id: str, preprocessing: str) -> tuple[bool, str]:
    """Whether EnvPool can run ``env_id`` with this preprocessing, and a phrase saying why (not)."""
    if not envpool_available():
        return False, INSTALL_HINT
    import envpool

    task = envpool_task(env_id)
    if task not in envpool.list_all_envs():
        return False, f"EnvPool provides no {env_id!r} (looked for {task!r})"
    atari = _is_atari_task(env_id)
    if atari and preprocessing != "atari":
        return False, "EnvPool's Atari envs always preprocess frames; set env.preprocessing: atari"
    if not atari and preprocessing == "atari":
        return False, f"{env_id!r} is not an Atari env, so EnvPool cannot apply env.preprocessing 'atari'"
    return True, f"EnvPool {envpool.__version__} provides {task}"


def _sticky_default(env_id: str) -> float:
    """ALE v5 ids use sticky actions (0.25, Machado et al. 2018); the NoFrameskip-v4 ids none."""
    return 0.25 if (env_id.partition(":")[2] or env_id).startswith("ALE/") else 0.0


def envpool_kwargs(env_id: str, atari: AtariSettings | None, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """EnvPool ``make`` keywords equivalent to the gymnasium path's preprocessing and env kwargs."""
    if atari is None:
        return dict(env_kwargs)
    kwargs = {k: v for k, v in env_kwargs.items() if k not in ("frameskip", "repeat_action_probability")}
    return {
        **kwargs,
        "frame_skip": atari.frame_skip, "stack_num": atari.stack, "img_height": atari.screen_size,
        "img_width": atari.screen_size, "noop_max": atari.noop_max, "episodic_life": atari.terminal_on_life_loss,
        "reward_clip": atari.reward_clip, "gray_scale": True, "use_fire_reset": False,
        "repeat_action_probability": float(env_kwargs.get("repeat_action_probability", _sticky_default(env_id))),
    }


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """EnvPool's synchronous gymnasium pool with this project's NEXT_STEP and frame-count conventions."""

    def __init__(self, env_id: str, num_envs: int, atari: AtariSettings | None, env_kwargs: dict[str, Any],
                 num_threads: int = 0) -> None:
        if not envpool_available():
            raise ModuleNotFoundError(INSTALL_HINT)
        super().__init__()
        self.env_id, self.num_envs = env_id, int(num_envs)
        self._make_kwargs = {**envpool_kwargs(env_id, atari, env_kwargs), "num_threads": int(num_threads)}
        self._frames_per_step = atari.frame_skip if atari is not None else 1
        self._pool = self._build(seed=0)
        self.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "backend": "envpool"}
        # EnvPool's own ``action_space`` is the single space; batch both as gymnasium does
        self.single_observation_space = self._pool.observation_space
        self.single_action_space = self._pool.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._seed = 0
        self._resetting = np.zeros(self.num_envs, dtype=np.bool_)

    def _build(self, seed: int) -> Any:
        import envpool

        return envpool.make(envpool_task(self.env_id), env_type="gymnasium", num_envs=self.num_envs,
                            seed=int(seed), **self._make_kwargs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset every sub-env; a new ``seed`` rebuilds the pool so sub-env i is seeded ``seed + i``."""
        if seed is not None and int(seed) != self._seed:
            self._pool.close()
            self._pool, self._seed = self._build(int(seed)), int(seed)
        obs, info = self._pool.reset()
        self._resetting[:] = False
        return obs, {**info, "frames": np.zeros(self.num_envs, dtype=np.int64),
                     "_frames": np.ones(self.num_envs, dtype=np.bool_)}

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = np.asarray(actions)
        if actions.shape[:1] != (self.num_envs,):  # EnvPool reads num_envs actions, whatever it is given
            raise ValueError(f"expected a batch of {self.num_envs} actions, got shape {actions.shape}")
        obs, reward, terminated, truncated, info = self._pool.step(actions)
        frames = np.where(self._resetting, 0, self._frames_per_step).astype(np.int64)
        self._resetting = np.logical_or(terminated, truncated)
        info = {**info, "frames": frames, "_frames": np.ones(self.num_envs, dtype=np.bool_)}
        return obs, np.asarray(reward, dtype=np.float32), terminated, truncated, info

    def close_extras(self, **kwargs: Any) -> None:
        self._pool.close()
