"""Environment construction for the reference trainers: id checks, vectorization choice, vector envs.

Every vector backend built here uses gymnasium's NEXT_STEP autoreset: the step after a sub-env ends
returns that sub-env's reset observation with reward 0 and terminated = truncated = False, and the
action given for it is ignored. The backends live in their own modules (``serial_env.py``,
``async_env.py``, ``envpool_env.py``); EnvPool is adapted to the same convention.
``env.preprocessing: atari`` wraps each serial/sync/async sub-env in ``atari.make_atari_env``.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec, load_env_creator
from gymnasium.vector import AutoresetMode

from reference_trainers.envs import atari
from reference_trainers.envs import envpool_backend as envpool_env
from reference_trainers.envs import partial_obs
from reference_trainers.envs.async_backend import CheckedAsyncVectorEnv
from reference_trainers.envs.serial_backend import SerialVectorEnv
from reference_trainers.envs.atari import AtariSettings
from reference_trainers.config.schema import EnvConfig

partial_obs.register()

VECTORIZATION_MODES: tuple[str, ...] = ("serial", "sync", "async", "native", "envpool")

_ACCEPTED_REQUESTS = ("auto", *VECTORIZATION_MODES)


class EnvConfigError(ValueError):
    """Bad env id / vectorization request; the message is one line naming the dotted config key."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


@dataclass(frozen=True)
class VectorizationChoice:
    """The vectorization mode to use and one short sentence saying why."""

    mode: str
    reason: str


def _quoted(values: Sequence[str]) -> str:
    return ", ".join(repr(v) for v in values)


def _split_module(env_id: str) -> tuple[str | None, str]:
    """Split gymnasium's ``module:EnvName-vN`` form into (module, registry id)."""
    module, sep, name = env_id.partition(":")
    return (module, name) if sep else (None, env_id)


def check_env_id(env_id: str) -> None:
    """Raise EnvConfigError unless ``env_id`` (optionally ``module:EnvName-vN``) is registered.

    As in ``gymnasium.make``, the module part is imported first so that it can register the env.
    Unversioned ids are rejected so that a benchmark always pins the env version.
    """
    if not isinstance(env_id, str) or not env_id.strip():
        raise EnvConfigError(
            f"env.id: {env_id!r} is not an environment id; accepted: a gymnasium registry id such as "
            "'CartPole-v1' or 'module:EnvName-vN'"
        )
    module, name = _split_module(env_id)
    if name not in gym.registry and atari.looks_like_atari(name) and not atari.register_atari_envs():
        raise EnvConfigError(f"env.id: {env_id!r} needs ale-py, which is not installed: {atari.INSTALL_HINT}")
    if module is not None:
        try:
            importlib.import_module(module)
        except Exception as err:  # any import-time failure of a user module is a config error
            raise EnvConfigError(
                f"env.id: {env_id!r}: cannot import module {module!r} ({type(err).__name__}: {err}); "
                f"accepted: 'module:EnvName-vN' where the module is importable and registers EnvName-vN"
            ) from err
    if name in gym.registry:
        return
    matches = difflib.get_close_matches(name, list(gym.registry.keys()), n=3, cutoff=0.6)
    hint = f"did you mean {_quoted(matches)}? " if matches else ""
    raise EnvConfigError(
        f"env.id: {env_id!r} is not a registered gymnasium environment; {hint}accepted: an id in "
        "gymnasium.registry (e.g. 'CartPole-v1') or 'module:EnvName-vN' with a module that registers it"
    )


def _spec(env_id: str) -> EnvSpec:
    check_env_id(env_id)
    return gym.registry[_split_module(env_id)[1]]


def _native_status(spec: EnvSpec) -> tuple[bool, str]:
    """Whether the spec's vector entry point can be used here, and a phrase saying why (not)."""
    entry = spec.vector_entry_point
    if entry is None:
        return False, f"{spec.id} has no vector entry point"
    if spec.additional_wrappers:
        return False, f"{spec.id}'s spec adds wrappers that a vector entry point cannot apply"
    if callable(entry):
        return True, f"{spec.id} has a callable vector entry point"
    try:
        load_env_creator(entry)
    except Exception as err:  # e.g. the phys2d entry points need jax
        return False, f"{spec.id}'s vector entry point {entry} is not importable ({type(err).__name__}: {err})"
    return True, f"{spec.id} has an importable vector entry point ({entry})"


def _check_action_repeat(action_repeat: int) -> None:
    if isinstance(action_repeat, bool) or not isinstance(action_repeat, (int, np.integer)) or action_repeat < 1:
        raise EnvConfigError(f"env.action_repeat: {action_repeat!r} is invalid; accepted: an integer >= 1")


def resolve_vectorization(env_id: str, requested: str, *, action_repeat: int = 1,
                          preprocessing: str = "none", num_envs: int | None = None,
                          native_min_envs: int = 2) -> VectorizationChoice:
    """Turn a requested mode (one of VECTORIZATION_MODES or 'auto') into a concrete mode with a reason.

    'auto' picks 'envpool' for Atari when EnvPool is installed and provides the game (its C++
    thread pool steps and preprocesses frames outside the GIL), else 'native' when the env has an
    importable vector entry point, action_repeat == 1 and at least ``native_min_envs`` sub-envs
    (fewer pick 'serial': a loop of a few plain env steps costs less than a vector env's batched
    array code, which costs about the same for any count), else 'sync' (in-process envs beat
    subprocess ones for cheap envs on small machines).
    """
    if requested not in _ACCEPTED_REQUESTS:
        raise EnvConfigError(
            f"env.vectorization: {requested!r} is not a vectorization mode; accepted: {_quoted(_ACCEPTED_REQUESTS)}"
        )
    _check_action_repeat(action_repeat)
    spec = _spec(env_id)
    if requested == "envpool" or (requested == "auto" and preprocessing == "atari"):
        pool_ok, pool_why = envpool_env.envpool_status(spec.id, preprocessing)
        if requested == "envpool":
            if not pool_ok:
                raise EnvConfigError(f"env.vectorization: 'envpool' is not available: {pool_why}; "
                                     f"accepted for {env_id!r}: {_quoted(('auto', 'serial', 'sync', 'async'))}")
            if action_repeat > 1:
                raise EnvConfigError(f"env.vectorization: 'envpool' cannot be used with env.action_repeat="
                                     f"{int(action_repeat)}; accepted: env.atari.frame_skip for Atari, or action_repeat 1")
            return VectorizationChoice("envpool", "requested explicitly")
        if pool_ok and action_repeat == 1:
            return VectorizationChoice("envpool", f"{pool_why}: C++ threads step and preprocess frames outside the GIL")
        if preprocessing == "atari":
            return VectorizationChoice("sync", f"{pool_why}, so in-process sync vectorization is used")
    if preprocessing == "atari" and requested == "native":
        raise EnvConfigError("env.vectorization: 'native' cannot apply env.preprocessing 'atari' per sub-env; "
                             "accepted with atari preprocessing: 'auto', 'serial', 'sync', 'async', 'envpool'")
    native_ok, why = _native_status(spec)
    if requested == "native":
        if not native_ok:
            raise EnvConfigError(
                f"env.vectorization: 'native' is not available because {why}; "
                f"accepted for {env_id!r}: {_quoted(('auto', 'serial', 'sync', 'async'))}"
            )
        if action_repeat > 1:
            raise EnvConfigError(
                f"env.vectorization: 'native' cannot be used with env.action_repeat={int(action_repeat)} "
                "(action repeat is applied per sub-env); accepted: 'auto', 'serial', 'sync', 'async', "
                "or 'native' with action_repeat 1"
            )
        return VectorizationChoice("native", "requested explicitly")
    if requested != "auto":
        return VectorizationChoice(requested, "requested explicitly")
    if not native_ok:
        return VectorizationChoice("sync", f"{why}, so in-process sync vectorization is used")
    if action_repeat > 1:
        return VectorizationChoice(
            "sync", f"action_repeat={int(action_repeat)} must wrap each sub-env, which a native vector env cannot do"
        )
    if num_envs is not None and num_envs < native_min_envs:
        return VectorizationChoice("serial", f"{why}, but {num_envs} plain env step{'s' if num_envs > 1 else ''} "
                                             "cost less than the vector env's batched array code (fewer sub-envs "
                                             f"than tuning.native_min_envs = {native_min_envs})")
    return VectorizationChoice("native", why)


def check_spaces(env_id: str, algo: str, observation_space: gym.Space, action_space: gym.Space) -> None:
    """EnvConfigError unless the trainers can take these spaces: a Box observation (a flat vector, or
    uint8 image frames) for every algorithm, and a Discrete action for DQN and IQN, Discrete or Box
    for PPO. Checked when a config is resolved, before an env is stepped."""
    if not isinstance(observation_space, gym.spaces.Box):
        raise EnvConfigError(
            f"env.id: {env_id!r} has observation space {observation_space}, which the trainers cannot take; "
            "accepted: an env with Box observations (a vector, or uint8 image frames), e.g. CartPole-v1"
        )
    if algo in ("dqn", "iqn"):
        if not isinstance(action_space, gym.spaces.Discrete):
            raise EnvConfigError(
                f"env.id: {algo} needs a Discrete action space, {env_id!r} has {action_space}; "
                "accepted: an env with discrete actions (e.g. CartPole-v1, Acrobot-v1), or algo: ppo"
            )
    elif not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)):
        raise EnvConfigError(
            f"env.id: {algo} cannot act in {env_id!r}'s action space {action_space}; "
            "accepted: an env with Discrete or Box actions (e.g. CartPole-v1, Pendulum-v1)"
        )


def single_action_space(env_id: str, env_kwargs: dict[str, Any] | None = None) -> gym.Space:
    """The action space of one ``env_id`` env (built once, then closed)."""
    return single_spaces(env_id, env_kwargs)[1]


def single_spaces(env_id: str, env_kwargs: dict[str, Any] | None = None,
                  atari_settings: AtariSettings | None = None) -> tuple[gym.Space, gym.Space]:
    """(observation space, action space) of one sub-env as the trainers see it (built once, then closed)."""
    check_env_id(env_id)
    env = _make_single(env_id, 1, dict(env_kwargs or {}), atari_settings)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


class ActionRepeat(gym.Wrapper):
    """Repeat each action ``k`` times, summing rewards and stopping early at termination or truncation.

    ``info['frames']`` is the number of underlying env steps taken (``0`` in the reset info, so the
    NEXT_STEP reset step of a vector env counts zero frames in :func:`frames_in_step` even without its mask).
    """

    def __init__(self, env: gym.Env, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"ActionRepeat needs an integer k >= 1, got {k!r}")
        super().__init__(env)
        self.k = int(k)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, {**info, "frames": 0}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        total, frames, steps = 0.0, 0, 0
        while True:
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            frames += int(info.get("frames", 1))  # a frame-skipping env below reports its own frames
            steps += 1
            if terminated or truncated or steps == self.k:
                return obs, total, terminated, truncated, {**info, "frames": frames}


def frames_in_step(info: dict[str, Any], num_envs: int, resetting: np.ndarray | None = None) -> int:
    """Sub-environment frames (transitions) taken by the last vector step.

    A sub-env in ``resetting`` (its last episode ended, so under NEXT_STEP this step only reset
    it) took no transition and counts 0; the trainers pass their own mask of those rows. If the
    vector info carries ``frames`` (sub-envs wrapped in ActionRepeat) the others count their
    ``frames`` where the ``_frames`` mask is set (a reset step reports 0 there as well), else 1.
    """
    frames = info.get("frames")
    if frames is None:
        return int(num_envs) - (0 if resetting is None else int(np.count_nonzero(resetting)))
    counts = np.asarray(frames, dtype=np.int64).reshape(-1)
    mask = info.get("_frames")
    if mask is not None:
        counts = np.where(np.asarray(mask, dtype=np.bool_).reshape(-1), counts, 1)
    if resetting is not None:
        counts = np.where(np.asarray(resetting, dtype=np.bool_).reshape(-1), 0, counts)
    return int(counts.sum())


def _make_single(env_id: str, action_repeat: int, env_kwargs: dict[str, Any],
                 atari_settings: AtariSettings | None = None) -> gym.Env:
    if atari_settings is not None:
        env = atari.make_atari_env(env_id, atari_settings, env_kwargs)
    else:
        if atari.looks_like_atari(env_id):
            atari.register_atari_envs()  # a fresh subprocess has not registered the ALE ids yet
        env = gym.make(env_id, **env_kwargs)
    return ActionRepeat(env, action_repeat) if action_repeat > 1 else env


def make_vector_env(
    env_id: str,
    num_envs: int,
    mode: str,
    *,
    action_repeat: int = 1,
    env_kwargs: dict[str, Any] | None = None,
    atari_settings: AtariSettings | None = None,
) -> gym.vector.VectorEnv:
    """Build an un-reset NEXT_STEP vector env of ``num_envs`` copies of ``env_id`` with concrete ``mode``.

    serial/sync/async sub-envs are ``gymnasium.make(env_id, **env_kwargs)`` (preprocessed by
    ``atari.make_atari_env`` when ``atari_settings`` is given), wrapped in
    ``ActionRepeat(action_repeat)`` when it is > 1; 'native' uses the spec's vector entry point;
    'envpool' builds EnvPool's vector env with the same preprocessing; 'async' workers that fail
    raise ``EnvWorkerError`` naming the sub-env (see ``async_env``).
    The caller resets with a seed and seeds ``action_space``.
    """
    if mode not in VECTORIZATION_MODES:
        raise EnvConfigError(
            f"env.vectorization: make_vector_env needs a concrete mode, got {mode!r}; "
            f"accepted: {_quoted(VECTORIZATION_MODES)} (resolve 'auto' with resolve_vectorization)"
        )
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise EnvConfigError(f"env.num_envs: {num_envs!r} is invalid; accepted: an integer >= 1")
    resolve_vectorization(env_id, mode, action_repeat=action_repeat,
                          preprocessing="none" if atari_settings is None else "atari")
    kwargs = dict(env_kwargs or {})
    if mode == "native":
        return gym.make_vec(env_id, num_envs=int(num_envs), vectorization_mode="vector_entry_point", **kwargs)
    if mode == "envpool":
        return envpool_env.EnvPoolVectorEnv(_spec(env_id).id, int(num_envs), atari_settings, kwargs)
    env_fns = [partial(_make_single, env_id, int(action_repeat), kwargs, atari_settings) for _ in range(int(num_envs))]
    if mode == "serial":
        return SerialVectorEnv(env_fns)
    if mode == "sync":
        return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.NEXT_STEP)
    return CheckedAsyncVectorEnv(env_fns, env_id)


def vector_env_from_config(env: EnvConfig) -> gym.vector.VectorEnv:
    """``make_vector_env`` for a validated ``env`` config section with a concrete vectorization."""
    return make_vector_env(env.id, env.num_envs, env.vectorization, action_repeat=env.action_repeat,
                           env_kwargs=env.kwargs, atari_settings=atari_settings_from(env))


def atari_settings_from(env: EnvConfig) -> AtariSettings | None:
    """The Atari preprocessing of an ``env`` section, or None without it."""
    return AtariSettings(**env.atari.model_dump()) if env.preprocessing == "atari" else None


@dataclass
class OpenedEnvs:
    """A reset, seeded vector env and the observation layout the network sees."""

    envs: gym.vector.VectorEnv
    next_obs: np.ndarray
    obs_dim: int
    frames: bool
    """True for the cnn body on image observations: the network takes (C, H, W) frames."""
    obs_shape: tuple[int, ...]


def open_vector_env(config: EnvConfig, seed: int, body: str) -> OpenedEnvs:
    """Build the config's vector env, reset it with ``seed`` (sub-env i gets ``seed + i``) and seed
    its action space; observations are frames for ``body == 'cnn'`` on images, else flat rows."""
    envs = vector_env_from_config(config)
    obs, _ = envs.reset(seed=seed)
    envs.action_space.seed(seed)
    space = envs.single_observation_space
    obs_dim = int(np.prod(space.shape))
    frames = body == "cnn" and atari.is_image_space(space)
    return OpenedEnvs(envs, obs, obs_dim, frames, tuple(space.shape) if frames else (obs_dim,))
