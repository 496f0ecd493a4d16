"""Transition writers (reference_trainers/replay/writers.py): the n-step writer against a brute-force
reference over random multi-env rollouts (terminations, truncations, NEXT_STEP reset steps), a
hand-computed case, and the one-step writer as its n = 1 special case."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference_trainers.replay.writers import NStepWriter, OneStepWriter, TransitionBatch, make_writer

OBS_DIM = 2


def rollout(num_envs: int, steps: int, end_codes: list[int], rewards: list[float]) -> list[dict[str, np.ndarray]]:
    """A NEXT_STEP vector-env rollout: per step obs, action, reward, next_obs, terminated, truncated, valid.

    ``end_codes[t * num_envs + i]`` is 0 (the episode goes on), 1 (terminates) or 2 (is truncated).
    The step after an end is a reset step (invalid: reward 0, no done flag, next obs = reset obs).
    Observations are unique ids, so transitions can be matched exactly.
    """
    out, over, counter = [], np.zeros(num_envs, dtype=bool), 0
    obs = np.zeros((num_envs, OBS_DIM), dtype=np.float32)
    for i in range(num_envs):
        counter += 1
        obs[i] = (counter, i)
    for t in range(steps):
        next_obs = np.zeros_like(obs)
        terminated, truncated = np.zeros(num_envs, dtype=bool), np.zeros(num_envs, dtype=bool)
        reward = np.zeros(num_envs, dtype=np.float32)
        for i in range(num_envs):
            counter += 1
            next_obs[i] = (counter, i)
            if not over[i]:
                code = end_codes[(t * num_envs + i) % len(end_codes)]
                terminated[i], truncated[i] = code == 1, code == 2
                reward[i] = rewards[(t * num_envs + i) % len(rewards)]
        out.append({"obs": obs.copy(), "actions": np.arange(num_envs, dtype=np.int64) + 10 * t, "rewards": reward,
                    "next_obs": next_obs.copy(), "terminated": terminated, "truncated": truncated, "valid": ~over})
        over = terminated | truncated
        obs = next_obs
    return out


def brute_force(steps: list[dict[str, np.ndarray]], n: int, gamma: float) -> list[tuple]:
    """Every transition the writer must have emitted by the end, by the definition of n-step returns."""
    num_envs = len(steps[0]["valid"])
    expected = []
    for i in range(num_envs):
        live = [t for t, s in enumerate(steps) if s["valid"][i]]
        for pos, t in enumerate(live):
            window = live[pos:pos + n]
            end = next((k for k, u in enumerate(window) if steps[u]["terminated"][i] or steps[u]["truncated"][i]), None)
            if end is not None:
                window = window[:end + 1]
            elif len(window) < n:
                continue  # neither n steps nor an episode end yet: still pending
            ret = sum(gamma ** k * float(steps[u]["rewards"][i]) for k, u in enumerate(window))
            last = window[-1]
            boot = 0.0 if steps[last]["terminated"][i] else gamma ** len(window)
            expected.append((tuple(steps[t]["obs"][i]), int(steps[t]["actions"][i]), ret,
                             tuple(steps[last]["next_obs"][i]), boot))
    return expected


def run_writer(writer: OneStepWriter | NStepWriter, steps: list[dict[str, np.ndarray]]) -> list[TransitionBatch]:
    return [writer.push(s["obs"], s["actions"], s["rewards"], s["next_obs"], s["terminated"], s["truncated"],
                        s["valid"]) for s in steps]


def as_rows(batches: list[TransitionBatch]) -> list[tuple]:
    rows = []
    for b in batches:
        assert b.obs.dtype == b.next_obs.dtype == b.rewards.dtype == b.bootstrap.dtype == np.float32
        assert b.actions.dtype == np.int64
        for k in range(len(b)):
            rows.append((tuple(b.obs[k]), int(b.actions[k]), float(b.rewards[k]), tuple(b.next_obs[k]),
                         float(b.bootstrap[k])))
    return rows


def assert_same_transitions(got: list[tuple], expected: list[tuple]) -> None:
    key = lambda row: (row[0], row[1])  # noqa: E731 - (obs id, action) is unique per transition
    got, expected = sorted(got, key=key), sorted(expected, key=key)
    assert [key(r) for r in got] == [key(r) for r in expected]
    for g, e in zip(got, expected):
        assert g[3] == e[3], (g, e)  # next observation
        assert math.isclose(g[2], e[2], rel_tol=1e-5, abs_tol=1e-5), (g, e)  # return
        assert math.isclose(g[4], e[4], rel_tol=1e-6, abs_tol=1e-7), (g, e)  # bootstrap discount


@given(num_envs=st.integers(1, 4), steps=st.integers(1, 30), n=st.integers(1, 5),
       gamma=st.floats(0.5, 1.0), end_codes=st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=1, max_size=40),
       rewards=st.lists(st.floats(-5, 5, width=32), min_size=1, max_size=40))
def test_nstep_writer_matches_brute_force_returns(num_envs: int, steps: int, n: int, gamma: float,
                                                  end_codes: list[int], rewards: list[float]) -> None:
    data = rollout(num_envs, steps, end_codes, rewards)
    writer = NStepWriter(num_envs, gamma, n, (OBS_DIM,))
    assert_same_transitions(as_rows(run_writer(writer, data)), brute_force(data, n, gamma))


@given(num_envs=st.integers(1, 4), steps=st.integers(1, 25), gamma=st.floats(0.5, 1.0),
       end_codes=st.lists(st.sampled_from([0, 0, 1, 2]), min_size=1, max_size=30))
def test_one_step_writer_equals_the_nstep_writer_with_n_1(num_envs: int, steps: int, gamma: float,
                                                          end_codes: list[int]) -> None:
    data = rollout(num_envs, steps, end_codes, [1.0, -0.5, 2.0])
    plain = as_rows(run_writer(OneStepWriter(num_envs, gamma), data))
    chunked = as_rows(run_writer(NStepWriter(num_envs, gamma, 1, (OBS_DIM,)), data))
    assert sorted(plain) == sorted(chunked)
    assert_same_transitions(plain, brute_force(data, 1, gamma))


def test_nstep_writer_hand_computed_episode() -> None:
    # One env, n = 3, gamma = 0.5, rewards 1, 2, 4, 8, terminated at the 4th step:
    #   step 3 completes the window of step 1: R = 1 + 0.5*2 + 0.25*4 = 3, bootstrap 0.125 (= gamma^3)
    #   step 4 terminates: step 2: R = 2 + 0.5*4 + 0.25*8 = 6, step 3: R = 4 + 0.5*8 = 8, step 4: R = 8, bootstrap 0
    writer = NStepWriter(1, 0.5, 3, (1,))
    emitted = []
    for t, (reward, term) in enumerate([(1, False), (2, False), (4, False), (8, True)]):
        emitted.append(writer.push(np.array([[t]], np.float32), np.array([t]), np.array([reward], np.float64),
                                   np.array([[t + 1]], np.float32), np.array([term]), np.array([False]),
                                   np.array([True])))
    assert [len(b) for b in emitted] == [0, 0, 1, 3]
    first, last = emitted[2], emitted[3]
    np.testing.assert_array_equal(first.rewards, [3.0])
    np.testing.assert_array_equal(first.bootstrap, [0.125])
    np.testing.assert_array_equal(first.next_obs, [[3.0]])
    np.testing.assert_array_equal(last.obs[:, 0], [1, 2, 3])
    np.testing.assert_array_equal(last.rewards, [6.0, 8.0, 8.0])
    np.testing.assert_array_equal(last.bootstrap, [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(last.next_obs[:, 0], [4, 4, 4])  # every return ends at the final observation


def test_truncation_bootstraps_with_the_discount_of_the_steps_taken() -> None:
    writer = NStepWriter(1, 0.5, 3, (1,))
    writer.push(np.array([[0]], np.float32), np.array([0]), np.array([1.0]), np.array([[1]], np.float32),
                np.array([False]), np.array([False]), np.array([True]))
    out = writer.push(np.array([[1]], np.float32), np.array([1]), np.array([2.0]), np.array([[2]], np.float32),
                      np.array([False]), np.array([True]), np.array([True]))
    np.testing.assert_array_equal(out.rewards, [2.0, 2.0])          # 1 + 0.5*2, and 2
    np.testing.assert_array_equal(out.bootstrap, [0.25, 0.5])       # gamma^2 and gamma^1: not cut to zero
    np.testing.assert_array_equal(out.next_obs[:, 0], [2, 2])


@pytest.mark.parametrize("n", [1, 3])
def test_reset_steps_are_never_written(n: int) -> None:
    writer = make_writer(2, 0.9, n, (OBS_DIM,))
    data = rollout(2, 12, [0, 1, 0, 2], [1.0])
    written = sum(len(b) for b in run_writer(writer, data))
    flushed = sum(int(s["valid"].sum()) for s in data)
    pending = int(writer.count.sum()) if isinstance(writer, NStepWriter) else 0
    assert written + pending == flushed  # every valid step written or pending, no reset step ever
    reset_obs = {tuple(s["obs"][i]) for s in data for i in range(2) if not s["valid"][i]}
    assert reset_obs and not reset_obs & {row[0] for row in as_rows(run_writer(make_writer(2, 0.9, n, (OBS_DIM,)), data))}


def test_make_writer_picks_the_plain_writer_for_one_step() -> None:
    assert isinstance(make_writer(4, 0.99, 1, (3,)), OneStepWriter)
    chunked = make_writer(4, 0.99, 5, (3,))
    assert isinstance(chunked, NStepWriter) and chunked.n == 5
