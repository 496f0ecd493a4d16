"""Atari through ale-py (gymnasium's preprocessing on serial/sync/async) and the EnvPool backend."""

from __future__ import annotations

import numpy as np
import pytest

from reference_trainers.envs import atari
from reference_trainers.envs import envpool_backend as envpool_env
from reference_trainers.envs.atari import AtariSettings
from reference_trainers.config.schema import ConfigError, build_config
from reference_trainers.envs.factory import EnvConfigError, check_env_id, make_vector_env, resolve_vectorization
from reference_trainers.config.resolve import resolve_config

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

PONG = "ALE/Pong-v5"
SMALL = AtariSettings(frame_skip=4, screen_size=42, stack=3, noop_max=5)
needs_envpool = pytest.mark.skipif(not envpool_env.envpool_available(), reason="envpool is not installed")


def rollout(env, steps: int, seed: int = 7) -> tuple[list[np.ndarray], list[int]]:
    obs, info = env.reset(seed=seed)
    env.action_space.seed(seed)
    frames, seen = [], [obs.copy()]
    for _ in range(steps):
        obs, _, _, _, info = env.step(env.action_space.sample())
        seen.append(obs.copy())
        frames.append(int(np.sum(info["frames"])))
    return seen, frames


@pytest.mark.parametrize("mode", ["serial", "sync", "async"])
def test_atari_preprocessing_gives_stacked_uint8_frames_on_every_backend(mode: str) -> None:
    env = make_vector_env(PONG, 2, mode, atari_settings=SMALL)
    try:
        assert env.single_observation_space.shape == (3, 42, 42)
        seen, frames = rollout(env, 5)
    finally:
        env.close()
    assert all(o.dtype == np.uint8 and o.shape == (2, 3, 42, 42) for o in seen)
    assert frames == [2 * SMALL.frame_skip] * 5  # emulator frames, frame skip counted


def test_serial_and_sync_atari_envs_give_the_same_frames_for_the_same_seeds() -> None:
    runs = []
    for mode in ("serial", "sync"):
        env = make_vector_env(PONG, 2, mode, atari_settings=SMALL)
        try:
            runs.append(rollout(env, 6)[0])
        finally:
            env.close()
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_atari_base_env_runs_at_frameskip_1_under_the_wrapper() -> None:
    env = atari.make_atari_env(PONG, SMALL, {})
    try:
        assert env.unwrapped._frameskip == 1
    finally:
        env.close()


def test_atari_preprocessing_on_a_non_atari_env_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"env\.preprocessing: 'atari' needs an ALE env id"):
        resolve_config(build_config({}, ["device=cpu", "env.preprocessing=atari"]))


def test_missing_ale_py_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(atari, "ale_available", lambda: False)
    with pytest.raises(EnvConfigError, match=r"needs ale-py, which is not installed: pip install rlgauge\[atari\]"):
        check_env_id("ALE/NoSuchGame-v5")


def test_pong_resolves_to_the_cnn_body_and_uint8_transfer_off_on_the_cpu() -> None:
    resolution = resolve_config(build_config({}, ["device=cpu", f"env.id={PONG}", "env.preprocessing=atari",
                                                  "env.vectorization=sync", "optimizations.uint8_transfer=auto"]))
    assert resolution.config.model.body == "cnn"
    assert resolution.config.optimizations.uint8_transfer is False  # no host->device copy on the CPU
    assert "no host->device copy" in resolution.reasons["optimizations.uint8_transfer"]
    explicit = resolve_config(build_config({}, ["device=cpu", f"env.id={PONG}", "env.preprocessing=atari",
                                                "env.vectorization=sync", "optimizations.uint8_transfer=true"]))
    assert explicit.config.optimizations.uint8_transfer is True  # still measurable on the CPU


# --------------------------------------------------------------------------- envpool

def test_envpool_missing_is_a_one_line_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envpool_env, "envpool_available", lambda: False)
    with pytest.raises(EnvConfigError) as err:
        resolve_vectorization(PONG, "envpool", preprocessing="atari")
    assert "envpool is not installed: pip install rlgauge[envpool]" in str(err.value)
    assert resolve_vectorization(PONG, "auto", preprocessing="atari").mode == "sync"
    with pytest.raises(ModuleNotFoundError, match="pip install rlgauge"):
        envpool_env.EnvPoolVectorEnv(PONG, 2, SMALL, {})


def test_envpool_maps_the_atari_block_and_ids() -> None:
    kwargs = envpool_env.envpool_kwargs(PONG, SMALL, {})
    assert envpool_env.envpool_task(PONG) == envpool_env.envpool_task("PongNoFrameskip-v4") == "Pong-v5"
    assert (kwargs["frame_skip"], kwargs["stack_num"], kwargs["img_height"], kwargs["noop_max"]) == (4, 3, 42, 5)
    assert kwargs["episodic_life"] is False and kwargs["reward_clip"] is True and kwargs["use_fire_reset"] is False
    assert kwargs["repeat_action_probability"] == 0.25  # ALE v5's sticky actions
    assert envpool_env.envpool_kwargs("PongNoFrameskip-v4", SMALL, {})["repeat_action_probability"] == 0.0


@needs_envpool
def test_envpool_pong_gives_the_same_observation_layout_as_gymnasium() -> None:
    env = make_vector_env(PONG, 2, "envpool", atari_settings=SMALL)
    try:
        assert env.single_observation_space.shape == (3, 42, 42)
        seen, frames = rollout(env, 4)
    finally:
        env.close()
    assert all(o.dtype == np.uint8 and o.shape == (2, 3, 42, 42) for o in seen)
    assert frames == [8] * 4


@needs_envpool
def test_envpool_autoreset_is_next_step_and_reset_steps_count_no_frames() -> None:
    env = make_vector_env("CartPole-v1", 3, "envpool")
    try:
        env.reset(seed=1)
        done_before = np.zeros(3, dtype=bool)
        checked = 0
        for _ in range(60):
            _, reward, terminated, truncated, info = env.step(np.zeros(3, dtype=np.int64))  # always push left: short episodes
            resetting = done_before
            assert np.all(reward[resetting] == 0) and not np.any((terminated | truncated)[resetting])
            assert np.all(info["elapsed_step"][resetting] == 0)
            assert np.array_equal(info["frames"], np.where(resetting, 0, 1))
            checked += int(resetting.sum())
            done_before = terminated | truncated
    finally:
        env.close()
    assert checked >= 3


@needs_envpool
def test_auto_picks_envpool_for_atari_when_installed_and_says_why() -> None:
    resolution = resolve_config(build_config({}, ["device=cpu", f"env.id={PONG}", "env.preprocessing=atari",
                                                  "env.vectorization=auto"]))
    assert resolution.config.env.vectorization == "envpool"
    assert "EnvPool" in resolution.reasons["env.vectorization"]


@needs_envpool
def test_envpool_without_the_atari_block_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="always preprocess frames; set env.preprocessing: atari"):
        resolve_config(build_config({}, ["device=cpu", f"env.id={PONG}", "env.vectorization=envpool"]))


@needs_envpool
def test_envpool_action_space_is_batched_and_a_wrong_action_batch_is_refused() -> None:
    env = make_vector_env(PONG, 2, "envpool", atari_settings=SMALL)
    try:
        env.reset(seed=1)
        assert env.action_space.sample().shape == (2,)  # EnvPool's own space is the single one
        with pytest.raises(ValueError, match="expected a batch of 2 actions"):
            env.step(np.int64(1))
    finally:
        env.close()
