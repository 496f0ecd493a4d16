"""Tests for reference_trainers.envs.factory: backends, autoreset semantics, config errors, helpers."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import pytest
from gymnasium.vector import AutoresetMode
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_trainers.envs.factory import (
    VECTORIZATION_MODES,
    ActionRepeat,
    EnvConfigError,
    VectorizationChoice,
    check_env_id,
    frames_in_step,
    make_vector_env,
    resolve_vectorization,
)
from reference_trainers.envs.episodes import EpisodeTracker
from reference_trainers.envs.serial_backend import SerialVectorEnv


class CountingEnv(gym.Env):
    """Deterministic env: reward at step t is t (1-based), terminates after `horizon` steps."""

    observation_space = gym.spaces.Box(0.0, 1000.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, horizon: int = 5) -> None:
        self.horizon = horizon
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return np.array([self.t], np.float32), float(self.t), self.t >= self.horizon, False, {}


def _rollout(env_id: str, mode: str, steps: int, num_envs: int = 3, seed: int = 7) -> dict[str, np.ndarray]:
    env = make_vector_env(env_id, num_envs, mode)
    try:
        obs, _ = env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        n_actions = int(env.single_action_space.n)
        record: dict[str, list[np.ndarray]] = {"obs": [obs], "rew": [], "term": [], "trunc": []}
        for _ in range(steps):
            obs, rew, term, trunc, _ = env.step(rng.integers(0, n_actions, size=num_envs))
            for key, value in zip(("obs", "rew", "term", "trunc"), (obs, rew, term, trunc)):
                record[key].append(np.array(value))
        return {key: np.stack(values) for key, values in record.items()}
    finally:
        env.close()


def test_serial_sync_async_give_identical_trajectories_on_cartpole() -> None:
    runs = {mode: _rollout("CartPole-v1", mode, steps=300) for mode in ("serial", "sync", "async")}
    assert runs["sync"]["term"].sum() >= 5, "rollout must cross several episode ends"
    for mode in ("serial", "async"):
        for key in ("obs", "rew", "term", "trunc"):
            np.testing.assert_array_equal(runs[mode][key], runs["sync"][key], err_msg=f"{mode} {key}")


def test_serial_sync_async_give_identical_trajectories_on_acrobot() -> None:
    runs = {mode: _rollout("Acrobot-v1", mode, steps=40) for mode in ("serial", "sync", "async")}
    for mode in ("serial", "async"):
        for key in ("obs", "rew", "term", "trunc"):
            np.testing.assert_array_equal(runs[mode][key], runs["sync"][key], err_msg=f"{mode} {key}")


def _dict_observation_cartpole() -> gym.Env:
    """CartPole whose observation is a Dict (a composite space: gymnasium's batching path)."""
    inner = gym.make("CartPole-v1")
    space = gym.spaces.Dict({"position": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
                             "velocity": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)})
    return gym.wrappers.TransformObservation(inner, lambda o: {"position": o[[0, 2]], "velocity": o[[1, 3]]}, space)


@pytest.mark.parametrize(("make_one", "actions"), [
    (lambda: gym.make("Pendulum-v1"), lambda rng, n: rng.uniform(-2, 2, size=(n, 1)).astype(np.float32)),
    (_dict_observation_cartpole, lambda rng, n: rng.integers(0, 2, size=n)),
], ids=["box-actions", "dict-observations"])
def test_serial_matches_gymnasiums_sync_env_on_box_actions_and_composite_observations(make_one, actions) -> None:  # noqa: ANN001
    """The serial backend's array fast paths (direct action indexing, one np.stack) and its
    composite-space path (gymnasium's iterate/concatenate) step exactly like SyncVectorEnv."""
    num_envs, rng = 3, np.random.default_rng(0)
    serial = SerialVectorEnv([make_one] * num_envs)
    sync = gym.vector.SyncVectorEnv([make_one] * num_envs, autoreset_mode=AutoresetMode.NEXT_STEP)
    try:
        got, want = serial.reset(seed=5)[0], sync.reset(seed=5)[0]
        for leaf_a, leaf_b in zip(*(list(x.values()) if isinstance(x, dict) else [x] for x in (got, want))):
            np.testing.assert_array_equal(leaf_a, leaf_b)
        for step in range(250):
            batch = actions(rng, num_envs)
            got_step, want_step = serial.step(batch), sync.step(batch)
            for a, b in zip(got_step[:4], want_step[:4]):  # obs, reward, terminated, truncated
                leaves_a, leaves_b = (list(x.values()) if isinstance(x, dict) else [x] for x in (a, b))
                for leaf_a, leaf_b in zip(leaves_a, leaves_b, strict=True):
                    np.testing.assert_array_equal(leaf_a, leaf_b, err_msg=f"step {step}")
                    assert leaf_a.dtype == leaf_b.dtype
    finally:
        serial.close()
        sync.close()


@pytest.mark.parametrize("mode", VECTORIZATION_MODES)
def test_all_backends_use_next_step_autoreset_with_zero_reward_reset_step(mode: str) -> None:
    if mode == "envpool":
        pytest.importorskip("envpool", reason="the envpool backend is an optional extra (rlgauge[envpool])")
    env = make_vector_env("CartPole-v1", 2, mode)
    try:
        assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        env.reset(seed=3)
        actions = np.zeros(2, dtype=np.int64)  # always-left ends episodes within ~10 steps
        prev_done = np.zeros(2, dtype=bool)
        checked = 0
        for _ in range(60):
            _, rew, term, trunc, _ = env.step(actions)
            if prev_done.any():
                assert np.all(rew[prev_done] == 0.0)
                assert not np.any(term[prev_done] | trunc[prev_done])
                checked += int(prev_done.sum())
            prev_done = term | trunc
        assert checked >= 2
    finally:
        env.close()


def test_native_cartpole_builds_vector_env_with_requested_num_envs() -> None:
    env = make_vector_env("CartPole-v1", 4, "native")
    try:
        assert env.num_envs == 4
        obs, _ = env.reset(seed=0)
        assert obs.shape == (4, 4)
        assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    finally:
        env.close()


def test_native_without_vector_entry_point_or_with_action_repeat_is_config_error() -> None:
    with pytest.raises(EnvConfigError, match="env.vectorization"):
        resolve_vectorization("Acrobot-v1", "native")
    with pytest.raises(EnvConfigError, match="env.vectorization"):
        make_vector_env("Acrobot-v1", 2, "native")
    with pytest.raises(EnvConfigError, match="env.vectorization"):
        resolve_vectorization("CartPole-v1", "native", action_repeat=2)


@pytest.mark.parametrize(
    ("env_id", "action_repeat", "expected"),
    [("CartPole-v1", 1, "native"), ("Acrobot-v1", 1, "sync"), ("Pendulum-v1", 1, "sync"), ("CartPole-v1", 2, "sync")],
)
def test_auto_vectorization_picks_native_only_when_usable(env_id: str, action_repeat: int, expected: str) -> None:
    choice = resolve_vectorization(env_id, "auto", action_repeat=action_repeat)
    assert isinstance(choice, VectorizationChoice)
    assert choice.mode == expected
    assert choice.reason.strip()


@pytest.mark.skipif(importlib.util.find_spec("jax") is not None, reason="jax installed: entry point is importable")
def test_auto_skips_vector_entry_point_that_needs_missing_dependency() -> None:
    choice = resolve_vectorization("phys2d/CartPole-v1", "auto")
    assert choice.mode == "sync"
    assert "jax" in choice.reason


def test_explicit_mode_is_kept_with_reason() -> None:
    for mode in ("serial", "sync", "async"):
        assert resolve_vectorization("CartPole-v1", mode) == VectorizationChoice(mode, "requested explicitly")


def test_unknown_env_id_is_one_line_error_with_key_value_and_suggestion() -> None:
    with pytest.raises(EnvConfigError) as info:
        check_env_id("CartPol-v1")
    message = str(info.value)
    assert "env.id" in message and "CartPol-v1" in message
    assert "did you mean" in message and "'CartPole-v1'" in message
    assert "\n" not in message
    assert isinstance(info.value, ValueError)


def test_unimportable_env_module_is_config_error_naming_module() -> None:
    with pytest.raises(EnvConfigError) as info:
        check_env_id("nosuchmodule:Foo-v0")
    message = str(info.value)
    assert "env.id" in message and "nosuchmodule" in message and "\n" not in message
    with pytest.raises(EnvConfigError):
        make_vector_env("nosuchmodule:Foo-v0", 2, "sync")


def test_unknown_vectorization_lists_accepted_values() -> None:
    with pytest.raises(EnvConfigError) as info:
        resolve_vectorization("CartPole-v1", "threads")
    message = str(info.value)
    assert "env.vectorization" in message and "threads" in message
    for accepted in ("auto", *VECTORIZATION_MODES):
        assert repr(accepted) in message


def test_make_vector_env_rejects_auto_and_bad_sizes() -> None:
    with pytest.raises(EnvConfigError, match="env.vectorization"):
        make_vector_env("CartPole-v1", 2, "auto")
    with pytest.raises(EnvConfigError, match="env.num_envs"):
        make_vector_env("CartPole-v1", 0, "sync")
    with pytest.raises(EnvConfigError, match="env.action_repeat"):
        make_vector_env("CartPole-v1", 2, "sync", action_repeat=0)


@pytest.fixture
def user_env_module(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = "rt_user_envs_for_test"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            import gymnasium as gym
            import numpy as np

            class Tiny(gym.Env):
                observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
                action_space = gym.spaces.Discrete(2)

                def reset(self, *, seed=None, options=None):
                    super().reset(seed=seed)
                    return self.np_random.uniform(-1, 1, 2).astype(np.float32), {}

                def step(self, action):
                    return np.zeros(2, np.float32), float(action), False, False, {}

            gym.register(id="RtUserTiny-v0", entry_point=f"{__name__}:Tiny", max_episode_steps=3)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    gym.registry.pop("RtUserTiny-v0", None)
    sys.modules.pop(name, None)


def test_user_env_registered_by_module_import_works(user_env_module: str) -> None:
    env_id = f"{user_env_module}:RtUserTiny-v0"
    check_env_id(env_id)
    assert resolve_vectorization(env_id, "auto").mode == "sync"
    env = make_vector_env(env_id, 2, "serial")
    try:
        obs, _ = env.reset(seed=1)
        assert obs.shape == (2, 2)
        rewards, truncs = [], []
        for _ in range(4):
            _, rew, _, trunc, _ = env.step(np.array([1, 0]))
            rewards.append(rew)
            truncs.append(trunc)
        np.testing.assert_array_equal(np.stack(rewards), [[1, 0], [1, 0], [1, 0], [0, 0]])
        np.testing.assert_array_equal(np.stack(truncs)[:, 0], [False, False, True, False])
    finally:
        env.close()


def test_action_repeat_sums_rewards_and_stops_at_termination() -> None:
    env = ActionRepeat(CountingEnv(horizon=5), 3)
    _, info = env.reset(seed=0)
    assert info["frames"] == 0
    obs, rew, term, trunc, info = env.step(0)
    assert (rew, term, trunc, info["frames"], obs[0]) == (6.0, False, False, 3, 3.0)
    obs, rew, term, trunc, info = env.step(0)
    assert (rew, term, trunc, info["frames"], obs[0]) == (9.0, True, False, 2, 5.0)
    assert isinstance(info["frames"], int)


def test_action_repeat_stops_at_truncation() -> None:
    env = ActionRepeat(gym.wrappers.TimeLimit(CountingEnv(horizon=100), max_episode_steps=4), 3)
    env.reset(seed=0)
    assert env.step(0)[1] == 6.0
    _, rew, term, trunc, info = env.step(0)
    assert (rew, term, trunc, info["frames"]) == (4.0, False, True, 1)
    with pytest.raises(ValueError):
        ActionRepeat(CountingEnv(), 0)


def test_frames_in_step_sums_frames_and_counts_reset_steps_as_zero() -> None:
    def fns() -> list:
        return [lambda: ActionRepeat(CountingEnv(horizon=5), 3), lambda: ActionRepeat(CountingEnv(horizon=100), 3)]

    serial, sync = SerialVectorEnv(fns()), gym.vector.SyncVectorEnv(fns(), autoreset_mode=AutoresetMode.NEXT_STEP)
    serial.reset(seed=0)
    sync.reset(seed=0)
    for expected in (6, 5, 3, 6):  # env 0: 3 frames, 2 frames + termination, reset step (0), 3 frames
        step_serial, step_sync = serial.step(np.zeros(2, np.int64)), sync.step(np.zeros(2, np.int64))
        assert frames_in_step(step_serial[4], 2) == expected
        assert frames_in_step(step_sync[4], 2) == expected
        np.testing.assert_array_equal(step_serial[4]["frames"], step_sync[4]["frames"])
        np.testing.assert_array_equal(step_serial[4]["_frames"], step_sync[4]["_frames"])
    assert frames_in_step({}, 4) == 4
    assert frames_in_step({}, 4, np.array([False, True, False, True])) == 2  # two sub-envs only reset
    # a reset row counts 0 even where a wrapper's info left it unmasked
    assert frames_in_step({"frames": np.array([2, 3]), "_frames": np.array([True, False])}, 2, np.array([False, True])) == 2
    assert frames_in_step({"frames": np.array([2, 0, 0]), "_frames": np.array([True, False, True])}, 3) == 3


def test_frames_in_step_with_cartpole_action_repeat() -> None:
    env = make_vector_env("CartPole-v1", 3, "sync", action_repeat=2)
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.ones(3, np.int64))
    assert frames_in_step(info, 3) == 6
    env.close()


def test_episode_tracker_exact_returns_under_next_step_autoreset() -> None:
    tracker = EpisodeTracker(2, window=2)
    assert tracker.mean_recent() is None and tracker.completed == 0
    f, t = False, True
    steps = [  # (rewards, terminated, truncated, expected finished returns)
        ([1.0, 1.0], [f, f], [f, f], []),
        ([1.0, 2.0], [t, f], [f, f], [2.0]),
        ([0.0, 1.0], [f, f], [f, t], [4.0]),  # env 0 reset step; env 1 truncated at length 3
        ([5.0, 0.0], [f, f], [f, f], []),  # env 1 reset step
        ([1.0, 7.0], [t, f], [f, f], [6.0]),
    ]
    for rewards, term, trunc, expected in steps:
        assert tracker.update(np.array(rewards, np.float32), np.array(term), np.array(trunc)) == expected
    assert tracker.completed == 3
    assert tracker.mean_recent() == pytest.approx(5.0)  # window 2: (4 + 6) / 2
    assert tracker.mean_recent_length() == pytest.approx(2.5)  # lengths 3 and 2, reset steps excluded


def test_episode_tracker_matches_cartpole_returns_and_lengths() -> None:
    env = make_vector_env("CartPole-v1", 3, "sync")
    tracker = EpisodeTracker(3, window=1000)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(200):
        _, rew, term, trunc, _ = env.step(rng.integers(0, 2, size=3))
        tracker.update(rew, term, trunc)
    env.close()
    assert tracker.completed > 5
    assert tracker.mean_recent() == pytest.approx(tracker.mean_recent_length())  # CartPole: reward 1 per step


@settings(max_examples=30, deadline=None)
@given(num_envs=st.integers(1, 4), seed=st.integers(0, 2**16), reload_at=st.integers(0, 40))
def test_episode_tracker_matches_a_per_env_loop(num_envs: int, seed: int, reload_at: int) -> None:
    """The tracker (with its all-mid-episode shortcut, and across a checkpoint reload) against the rule
    written out per sub-env: a reset step's reward is ignored; an episode's return sums the rest."""
    rng = np.random.default_rng(seed)
    tracker = EpisodeTracker(num_envs, window=1000)
    running, resetting, finished_all = [0.0] * num_envs, [False] * num_envs, []
    for step in range(40):
        if step == reload_at:
            state = tracker.state_dict()
            tracker = EpisodeTracker(num_envs, window=1000)
            tracker.load_state_dict(state)
        rewards = rng.integers(0, 4, size=num_envs).astype(np.float32)
        terminated, truncated = rng.random(num_envs) < 0.15, rng.random(num_envs) < 0.05
        expected = []
        for i in range(num_envs):
            if resetting[i]:
                resetting[i] = False
                continue
            running[i] += float(rewards[i])
            if terminated[i] or truncated[i]:
                expected.append(running[i])
                running[i], resetting[i] = 0.0, True
        finished_all += expected
        assert tracker.update(rewards, terminated, truncated) == expected
    assert tracker.completed == len(finished_all)


@settings(max_examples=40, deadline=None)
@given(num_envs=st.integers(1, 4), seed=st.integers(0, 2**16), blocks=st.lists(st.integers(1, 12), min_size=1,
                                                                                max_size=5),
       end_rate=st.sampled_from([0.0, 0.05, 0.3]))
def test_episode_tracker_block_update_equals_its_steps_one_by_one(num_envs: int, seed: int, blocks: list[int],
                                                                  end_rate: float) -> None:
    """``update_block`` (lean_rollout's once-per-rollout accounting) leaves the tracker as the same
    steps through ``update`` do, and hands back the same finished returns, bit for bit (fractional
    rewards, so any reassociation of the running sums would show)."""
    rng = np.random.default_rng(seed)
    one_by_one, blockwise = EpisodeTracker(num_envs, window=1000), EpisodeTracker(num_envs, window=1000)
    for steps in blocks:
        rewards = rng.normal(size=(steps, num_envs)).astype(np.float32) / 3
        done = rng.random((steps, num_envs)) < end_rate
        expected = [r for t in range(steps) for r in one_by_one.update(rewards[t], done[t], np.zeros_like(done[t]))]
        assert blockwise.update_block(rewards, done) == expected
        for name, value in one_by_one.state_dict().items():
            other = blockwise.state_dict()[name]
            assert (torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other), name
