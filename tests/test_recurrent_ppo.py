"""Recurrent PPO (``model.recurrent: lstm|gru``): hidden-state handling, sequence replay, flags.

- the recurrent network: one batched step equals per-row steps; a start flag zeroes the
  state; ``unroll`` over a sequence with episode starts equals step-by-step calls;
- the trainer: the state is carried across steps and zeroed where an episode opens; the
  values and log-probabilities stored while acting are reproduced by the update's unroll
  (so truncated BPTT trains on what was collected); plain and batched acting agree;
- config: what cannot be honoured is a one-line error; every flag that applies runs;
- the masked-velocity CartPole and, marked slow, the learning check: the LSTM passes a mean
  return of 150 within 300k env steps where the feed-forward policy stays below 100.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import TINY

from reference_trainers import ResumableTrainer, build_trainer
from reference_trainers.config.schema import ConfigError, ModelConfig, build_config
from reference_trainers.nets.networks import RecurrentActorCritic
from reference_trainers.envs.partial_obs import CARTPOLE_NO_VELOCITY_ID
from reference_trainers.config.resolve import resolve_config
from reference_trainers.ppo.trainer import PPOTrainer, evaluate_actions
from reference_trainers.ppo.recurrent import RecurrentPPOTrainer, episode_starts

RECURRENT = TINY + ["model.recurrent=lstm", "model.recurrent_size=8", f"env.id={CARTPOLE_NO_VELOCITY_ID}"]


def make(*overrides: str) -> RecurrentPPOTrainer:
    trainer = build_trainer(resolve_config(build_config({}, RECURRENT + list(overrides))))
    assert isinstance(trainer, RecurrentPPOTrainer)
    return trainer


def network(kind: str) -> RecurrentActorCritic:
    torch.manual_seed(0)
    config = ModelConfig(hidden_sizes=[8], recurrent=kind, recurrent_size=6)
    return RecurrentActorCritic(3, gym.spaces.Discrete(2), config)


# --------------------------------------------------------------------------- the network

@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_batched_step_equals_per_row_steps(kind: str) -> None:
    net = network(kind)
    obs, starts = torch.randn(5, 3), torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0])
    state = torch.randn(5, *net.initial_state(1, torch.device("cpu")).shape[1:])
    logits, values, new_state = net(obs, state, starts)
    for i in range(5):
        row = net(obs[i:i + 1], state[i:i + 1], starts[i:i + 1])
        torch.testing.assert_close(row[0], logits[i:i + 1], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(row[1], values[i:i + 1], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(row[2], new_state[i:i + 1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_start_flag_zeroes_the_state(kind: str) -> None:
    net = network(kind)
    obs = torch.randn(4, 3)
    zeros = net.initial_state(4, torch.device("cpu"))
    stale = torch.randn_like(zeros)
    fresh = net(obs, zeros, torch.zeros(4))
    restarted = net(obs, stale, torch.ones(4))
    carried = net(obs, stale, torch.zeros(4))
    for a, b in zip(fresh, restarted):
        torch.testing.assert_close(a, b)
    assert not torch.allclose(carried[0], fresh[0]), "the state had no effect: nothing is remembered"


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_unroll_equals_step_by_step_with_starts_inside_the_sequence(kind: str) -> None:
    net = network(kind)
    steps, batch = 7, 3
    obs = torch.randn(steps, batch, 3)
    starts = torch.zeros(steps, batch)
    starts[3, 0] = starts[5, 2] = starts[0, 1] = 1.0
    state = torch.randn(batch, *net.initial_state(1, torch.device("cpu")).shape[1:])
    logits, values = net.unroll(obs, state, starts)
    for t in range(steps):
        step_logits, step_values, state = net(obs[t], state, starts[t])
        torch.testing.assert_close(logits[t], step_logits, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(values[t], step_values, rtol=1e-5, atol=1e-6)


def test_episode_starts_follow_reset_steps() -> None:
    valid = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    first = torch.tensor([1.0, 0.0])
    expected = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert torch.equal(episode_starts(first, valid), expected)


# --------------------------------------------------------------------------- the trainer

def test_harness_and_standalone_pick_the_recurrent_trainer() -> None:
    config = build_config({}, RECURRENT)
    trainer = build_trainer(resolve_config(config))
    try:
        assert isinstance(trainer, RecurrentPPOTrainer) and isinstance(trainer, ResumableTrainer)
        assert isinstance(trainer.model, RecurrentActorCritic)
    finally:
        trainer.close()


def test_the_feed_forward_trainer_refuses_a_recurrent_config() -> None:
    with pytest.raises(ConfigError, match="model.recurrent"):
        PPOTrainer(build_config({}, RECURRENT))


def test_state_is_carried_and_zeroed_where_an_episode_opens() -> None:
    trainer = make("env.num_envs=3", "ppo.num_minibatches=1")
    try:
        trainer.collect()
        assert trainer.state.abs().sum() > 0, "no hidden state was carried"
        # replaying from zeros with the recorded starts reproduces the carried state exactly
        starts = episode_starts(trainer.rollout_starts, trainer.valid_buf)
        assert torch.equal(starts[0], torch.ones(3)), "the first observation after reset opens an episode"
        assert (starts[1:] == 1.0 - trainer.valid_buf[:-1]).all()
    finally:
        trainer.close()


@pytest.mark.parametrize("batch_inference", ["true", "false"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_update_replays_what_acting_computed(kind: str, batch_inference: str) -> None:
    """The unroll from the rollout's initial state gives the stored values and log-probabilities,
    across episode ends inside the rollout (a short CartPole episode ends within 64 steps)."""
    trainer = make(f"model.recurrent={kind}", f"optimizations.batch_inference={batch_inference}",
                   "ppo.num_steps=64", "ppo.num_minibatches=1")
    try:
        trainer.iterate()          # the second rollout starts from a carried, non-zero state
        trainer.collect()
        assert (trainer.valid_buf == 0).any(), "no episode ended inside the rollout: the test would be weak"
        assert trainer.rollout_state.abs().sum() > 0
        with torch.no_grad():
            logits, values = trainer.model.unroll(trainer.obs_buf, trainer.rollout_state,
                                                  episode_starts(trainer.rollout_starts, trainer.valid_buf))
            logprobs, _ = evaluate_actions(logits.flatten(0, 1), None, trainer.actions_buf.flatten())
        torch.testing.assert_close(values, trainer.values_buf, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logprobs, trainer.logprobs_buf.flatten(), rtol=1e-5, atol=1e-5)
    finally:
        trainer.close()


def test_plain_and_batched_acting_give_the_same_rollout_values() -> None:
    """Per-env and batched acting differ in their random draws, so compare the deterministic
    parts: the same observations and states give the same values and hidden states."""
    plain, batched = make("optimizations.batch_inference=false"), make("optimizations.batch_inference=true")
    try:
        obs = plain.next_obs
        state = torch.randn_like(plain.state)
        for trainer in (plain, batched):
            trainer.state = state.clone()
            trainer.starts = np.array([False, True])
            trainer.act(obs)
        torch.testing.assert_close(plain.state, batched.state, rtol=1e-6, atol=1e-6)
        assert not torch.allclose(plain.state, state), "acting did not advance the hidden state"
    finally:
        plain.close()
        batched.close()


def test_select_actions_leaves_the_rollout_state_alone() -> None:
    trainer = make()
    try:
        trainer.collect()
        state, starts = trainer.state.clone(), trainer.starts.copy()
        trainer.select_actions(trainer.next_obs)
        assert torch.equal(trainer.state, state) and np.array_equal(trainer.starts, starts)
    finally:
        trainer.close()


@pytest.mark.parametrize("flags", [
    ["model.recurrent=gru"],
    ["optimizations.batch_inference=false", "optimizations.sync_free_logging=false"],
    ["optimizations.optimizer_impl=forloop"],
    ["optimizations.optimizer_impl=foreach"],
    ["optimizations.amp=true", "optimizations.amp_dtype=bfloat16"],
    ["optimizations.batch_inference=true", "optimizations.inference_batch_size=1"],
    ["env.vectorization=serial"],
    ["env.action_repeat=2"],
])
def test_flags_that_apply_train_and_stay_finite(flags: list[str]) -> None:
    trainer = make(*flags)
    try:
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.iterate()
        trainer.iterate()
        after = list(trainer.model.parameters())
        assert any(not torch.equal(a, b) for a, b in zip(before, after)), "no parameter moved"
        assert all(torch.isfinite(p).all() for p in after)
        assert math.isfinite(trainer.last_stats["policy_loss"])
    finally:
        trainer.close()


@pytest.mark.slow  # compiles the step and the train-step closure (the unrolled loop: minutes cold on 2 cores)
@pytest.mark.parametrize("flag", ["compile_model", "compile_train_step"])
def test_compiled_paths_match_eager(flag: str) -> None:
    eager, compiled = make("ppo.num_steps=4"), make("ppo.num_steps=4", f"optimizations.{flag}=true")
    try:
        for trainer in (eager, compiled):
            trainer.iterate()
        assert not compiled.compile_fallback
        for a, b in zip(eager.model.parameters(), compiled.model.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    finally:
        eager.close()
        compiled.close()


# --------------------------------------------------------------------------- config

@pytest.mark.parametrize(("overrides", "fragment"), [
    (["algo=dqn", "model.recurrent=lstm"], "model.recurrent: 'lstm' is for algo ppo"),
    (["model.recurrent=lstm", "env.num_envs=3", "ppo.num_steps=16", "ppo.num_minibatches=2"],
     "does not divide env.num_envs=3"),
    (["model.recurrent=rnn"], "model.recurrent"),
    (["model.recurrent_size=0"], "model.recurrent_size"),
])
def test_bad_recurrent_settings_are_one_line_errors(overrides: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_config(build_config({}, ["device=cpu", *overrides]))
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_cartpole_without_velocities_observes_position_and_angle() -> None:
    masked, full = gym.make(CARTPOLE_NO_VELOCITY_ID), gym.make("CartPole-v1")
    obs, _ = masked.reset(seed=3)
    reference, _ = full.reset(seed=3)
    assert obs.shape == (2,) and obs.dtype == np.float32
    np.testing.assert_array_equal(obs, reference[[0, 2]])
    assert masked.spec.max_episode_steps == 500


# --------------------------------------------------------------------------- learning (slow)

def best_mean_return(recurrent: str, seed: int, budget: int, stop_at: float | None) -> tuple[float, int]:
    """Best mean return over the last 20 episodes within ``budget`` env steps of the preset's
    optimised variant (stopping early once ``stop_at`` is reached)."""
    from harness.specs.presets import load_preset

    data = load_preset("ppo-lstm-cartpole-masked").variant_data("optimized")
    overrides = ["device=cpu", f"seed={seed}", f"model.recurrent={recurrent}"]
    if recurrent == "none":
        overrides.append("model.hidden_sizes=[64,64]")
    trainer = build_trainer(resolve_config(build_config(data, overrides)))
    best, threads = -math.inf, torch.get_num_threads()
    try:
        while trainer.env_steps < budget and (stop_at is None or best < stop_at):
            trainer.iterate()
            mean = trainer.mean_recent_return()
            if trainer.tracker.completed >= 20 and mean is not None:
                best = max(best, mean)
    finally:
        trainer.close()
        torch.set_num_threads(threads)
    return best, trainer.env_steps


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_lstm_learns_cartpole_without_velocities(seed: int) -> None:
    best, steps = best_mean_return("lstm", seed, 300_000, stop_at=150.0)
    assert best >= 150.0, f"seed {seed}: best mean return {best} after {steps} env steps"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_feed_forward_policy_cannot_learn_cartpole_without_velocities(seed: int) -> None:
    best, steps = best_mean_return("none", seed, 300_000, stop_at=None)
    assert steps >= 300_000
    assert best < 100.0, f"seed {seed}: a memoryless policy reached {best}: the task is not partially observed"
