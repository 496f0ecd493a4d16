"""Tests for ``optimizations.numpy_acting``: the NumPy forward and sampling, that PPO and DQN take
the NumPy path when asked, that it keeps fp-reorder parity with the torch path, and the
configurations it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TINY
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from value_trainers import assert_params_close, make, train

from harness.cli import main
from harness.stats.parity import FP_REORDER as FP_REORDER_CLASS
from harness.stats.parity import TOLERANCES
from reference_trainers.config.schema import ConfigError, build_config
from reference_trainers.nets.networks import StackedMLPs, mlp
from reference_trainers.nets.mlp import BLOCK_SPLIT_MIN_WASTE, NumpyMLP
from reference_trainers.paths.numpy_acting import (column_sums, numpy_blas_threads, relu_, row_max, row_sums,
                                                    sample_categorical, sample_gaussian, taken_index)
from reference_trainers.config.resolve import resolve_config
from reference_trainers.ppo.trainer import PPOTrainer, action_noise, sample_action

FP_REORDER = {"rtol": TOLERANCES[FP_REORDER_CLASS].rtol, "atol": TOLERANCES[FP_REORDER_CLASS].atol}
ON = ["optimizations.batch_inference=true", "optimizations.numpy_acting=true"]
PPO_ON = ON + ["optimizations.lean_rollout=true"]
PPO_OFF = ["optimizations.batch_inference=true", "optimizations.lean_rollout=true", "optimizations.numpy_acting=false"]


# --------------------------------------------------------------------------- the NumPy pieces

@pytest.mark.parametrize("rows", [1, 7], ids=["one-row-as-vectors", "rows"])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_numpy_mlp_matches_the_torch_forward(activation: str, rows: int) -> None:
    torch.manual_seed(0)
    net = mlp(5, [32, 16], 3, activation, out_std=1.0)
    x = torch.randn(rows, 5)
    expected = net(x).detach().numpy()
    host_input = x.numpy().copy()
    got = NumpyMLP.of(net)(host_input)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, **FP_REORDER)
    np.testing.assert_array_equal(host_input, x.numpy())  # the input is left as it was


def test_numpy_mlp_sees_in_place_weight_changes_without_a_copy() -> None:
    torch.manual_seed(1)
    net = mlp(4, [8], 2, "tanh", out_std=1.0)
    host = NumpyMLP.of(net)
    x = np.ones((1, 4), dtype=np.float32)
    before = host(x).copy()
    with torch.no_grad():
        net[-1].bias.add_(1.0)  # as an in-place optimiser step does
    np.testing.assert_allclose(host(x), before + 1.0, rtol=1e-6)


def test_numpy_mlp_casts_wider_observations_to_float32() -> None:
    net = mlp(3, [4], 2, "relu", out_std=1.0)
    assert NumpyMLP.of(net)(np.zeros((2, 3), dtype=np.float64)).dtype == np.float32


def test_numpy_mlp_refuses_weights_it_cannot_view() -> None:
    net = mlp(3, [4], 2, "relu", out_std=1.0).double()
    with pytest.raises(ValueError, match="CPU float32"):
        NumpyMLP.of(net)


def test_numpy_stacked_actor_critic_matches_the_torch_one() -> None:
    torch.manual_seed(2)
    actor, critic = mlp(4, [16, 16], 2, "tanh", 0.01), mlp(4, [16, 16], 1, "tanh", 1.0)
    stacked = StackedMLPs(actor, critic)
    x = torch.randn(6, 4)
    logits, value = stacked(x)
    out = NumpyMLP(stacked.layers)(x.numpy())
    np.testing.assert_allclose(out[:, :stacked.split], logits.numpy(), **FP_REORDER)
    np.testing.assert_allclose(out[:, stacked.split:], value.numpy(), **FP_REORDER)


SPLIT_ROWS = -(-BLOCK_SPLIT_MIN_WASTE // (16 * 12 * 2))
"""Rows from which the hidden layers of the test's 16x12 pair run as two products."""


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("rows", [1, 64, SPLIT_ROWS - 1, SPLIT_ROWS, 2 * SPLIT_ROWS])
def test_side_by_side_forward_matches_the_two_networks(activation: str, rows: int) -> None:
    """One product per layer for a few rows, two half-width products for many: both are the two MLPs."""
    torch.manual_seed(3)
    actor, critic = mlp(4, [16, 12], 3, activation, 0.5), mlp(4, [16, 12], 1, activation, 1.0)
    x = torch.randn(rows, 4)
    out = NumpyMLP.side_by_side(actor, critic)(x.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(out[:, :3], actor(x).numpy(), **FP_REORDER)
        np.testing.assert_allclose(out[:, 3:], critic(x).numpy(), **FP_REORDER)


def test_side_by_side_forward_is_a_snapshot() -> None:
    """PPO builds it once per rollout: later weight changes must not show through until it is rebuilt."""
    torch.manual_seed(4)
    actor, critic = mlp(4, [8, 8], 2, "tanh", 0.5), mlp(4, [8, 8], 1, "tanh", 1.0)
    x = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32)
    forward = NumpyMLP.side_by_side(actor, critic)
    before = forward(x)
    with torch.no_grad():
        for p in [*actor.parameters(), *critic.parameters()]:
            p.add_(1.0)
    np.testing.assert_array_equal(forward(x), before)
    assert not np.allclose(NumpyMLP.side_by_side(actor, critic)(x), before)


def test_side_by_side_needs_one_layer_pattern() -> None:
    with pytest.raises(ValueError, match="same layer pattern"):
        NumpyMLP.side_by_side(mlp(4, [8, 8], 2, "tanh", 0.5), mlp(4, [8], 1, "tanh", 1.0))


@settings(max_examples=25, deadline=None)
@given(columns=st.sampled_from([1, 2, 3, 16, 17, 40]), rows=st.integers(1, 64), seed=st.integers(0, 2**16))
def test_row_and_column_reductions_match_numpys(columns: int, rows: int, seed: int) -> None:
    """The reductions the NumPy steps take as matrix-vector products or column loops: the same
    values as NumPy's own reductions, NaN kept, indices of the taken entries. Whole numbers (and a
    quarter) add up exactly in float32 in any order, so the sums must be equal, not just close."""
    rng = np.random.default_rng(seed)
    values = (rng.integers(-1000, 1000, (rows, columns)) / 4).astype(np.float32)
    np.testing.assert_array_equal(row_max(values), values.max(-1))
    np.testing.assert_array_equal(row_sums(values), values.sum(-1))
    np.testing.assert_array_equal(column_sums(values), values.sum(0))
    assert row_sums(values).dtype == column_sums(values).dtype == np.float32
    taken = rng.integers(0, columns, rows)
    np.testing.assert_array_equal(values.take(taken_index(taken, columns)), values[np.arange(rows), taken])
    values[0, -1] = np.nan
    assert np.isnan(row_max(values)[0]) and np.isnan(row_sums(values)[0]) and np.isnan(column_sums(values)[-1])


@pytest.mark.parametrize("shape", [(84,), (1, 84), (128, 120), (128, 120)])
def test_relu_in_place_is_numpys_maximum_with_zero(shape: tuple[int, ...]) -> None:
    """The in-place ReLU (against a kept array of zeros): NumPy's ``maximum(x, 0)`` bit for bit,
    NaN kept, and its zeros untouched by the arrays it was applied to (the shape repeats)."""
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    x.flat[0] = np.nan
    expected = np.maximum(x, np.float32(0.0))
    relu_(x)
    np.testing.assert_array_equal(x, expected)
    assert x.dtype == np.float32 and np.isnan(x.flat[0]) and (x >= 0).sum() == x.size - 1
    x[...] = 5.0
    after = np.full(shape, -1.0, dtype=np.float32)
    relu_(after)
    assert not after.any()


@settings(max_examples=25, deadline=None)
@given(actions=st.sampled_from([2, 3, 9, 16, 17, 24]), rows=st.integers(1, 16), seed=st.integers(0, 2**16))
@example(actions=17, rows=1, seed=7071)  # its one row's draw lies within 1e-5 of a running sum
def test_numpy_categorical_sampling_matches_the_torch_sampling(actions: int, rows: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(rows, actions, generator=generator)
    noise = action_noise(rows, True, (), generator, torch.device("cpu"))
    action, logprob = sample_action(logits, None, noise)
    host_action, host_logprob = sample_categorical(logits.numpy(), noise.numpy())
    cumulative = torch.softmax(logits, -1).cumsum(-1)
    clear = ((cumulative - noise.unsqueeze(-1)).abs() > 1e-5).all(-1)  # rows not on a rounding boundary
    assume(clear.any())  # every row's draw within 1e-5 of a running sum: rounding may pick either side
    np.testing.assert_array_equal(host_action[clear.numpy()], action[clear].numpy())
    assert host_logprob.dtype == np.float32
    np.testing.assert_allclose(host_logprob[clear.numpy()], logprob[clear].numpy(), **FP_REORDER)


@pytest.mark.parametrize("actions", [2, 3, 5, 16])
def test_numpy_categorical_running_sum_is_cumsums(actions: int) -> None:
    """Up to 16 actions the sample counts a running sum column by column: cumsum's additions in
    its order, so the same actions as ``cumsum`` bit for bit, boundary rows included: draws equal
    to a row's running sum at some column, and the largest float32 below 1 (where the last sum,
    left out of the count, may fall short of the draw)."""
    rng = np.random.default_rng(actions)
    logits = (3 * rng.standard_normal((4096, actions))).astype(np.float32)
    shifted = logits - logits.max(-1, keepdims=True)
    probs = np.exp(shifted - np.log(np.exp(shifted) @ np.ones(actions, np.float32))[:, None])
    noise = rng.random(4096, dtype=np.float32)
    rows = np.arange(1024)
    noise[:1024] = probs.cumsum(-1)[rows, rows % actions]  # exactly on a boundary
    noise[1024:1536] = np.nextafter(np.float32(1), np.float32(0))
    action, _ = sample_categorical(logits, noise)
    expected = np.minimum((probs.cumsum(-1) < noise[:, None]).sum(-1), actions - 1)
    np.testing.assert_array_equal(action, expected)


def test_numpy_gaussian_sampling_matches_the_torch_sampling() -> None:
    generator = torch.Generator().manual_seed(3)
    mean, log_std = torch.randn(5, 2, generator=generator), torch.tensor([-0.5, 0.3])
    noise = action_noise(5, False, (2,), generator, torch.device("cpu"))
    action, logprob = sample_action(mean, log_std, noise)
    host_action, host_logprob = sample_gaussian(mean.numpy(), log_std.numpy(), noise.numpy())
    np.testing.assert_allclose(host_action, action.numpy(), **FP_REORDER)
    assert host_logprob.dtype == np.float32
    np.testing.assert_allclose(host_logprob, logprob.numpy(), **FP_REORDER)


def numpy_blas_thread_counts() -> list[int]:
    from threadpoolctl import ThreadpoolController
    return [lib.num_threads for lib in ThreadpoolController().select(user_api="blas").lib_controllers
            if "numpy" in lib.filepath]


def test_numpy_blas_runs_single_threaded_while_a_numpy_acting_trainer_runs() -> None:
    """Idle NumPy BLAS threads spinning beside torch's slowed a 64-env PPO update 3x: one thread while acting."""
    numpy_blas_threads.apply(False)  # NumPy's BLAS as the process started it
    original = numpy_blas_thread_counts()
    if not original:
        pytest.skip("NumPy's BLAS is not one threadpoolctl can see here")
    fast, plain = ppo(*PPO_ON), ppo(*PPO_OFF)
    try:
        fast.activate()
        assert numpy_blas_thread_counts() == [1] * len(original)
        plain.activate()
        assert numpy_blas_thread_counts() == original
    finally:
        fast.close()
        plain.close()


# --------------------------------------------------------------------------- PPO

def ppo(*overrides: str) -> PPOTrainer:
    return PPOTrainer(build_config({}, TINY + list(overrides)))


def ppo_params_after(*overrides: str, iterations: int = 2) -> tuple[dict[str, torch.Tensor], PPOTrainer]:
    trainer = ppo(*overrides)
    try:
        for _ in range(iterations):
            trainer.iterate()
        return {k: p.detach().clone() for k, p in trainer.model.named_parameters()}, trainer
    finally:
        trainer.close()


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_ppo_numpy_acting_acts_without_torch_forwards(monkeypatch: pytest.MonkeyPatch, env: str) -> None:
    """With the flag, a rollout calls neither the stacked torch network nor the model."""
    trainer = ppo(f"env.id={env}", *PPO_ON)
    try:
        def no_torch(*args: object) -> None:
            raise AssertionError("a torch forward ran during a NumPy rollout")
        monkeypatch.setattr(StackedMLPs, "__call__", no_torch)
        monkeypatch.setattr(trainer.model, "forward", no_torch)
        trainer.collect()
        assert trainer.host_obs.any() and trainer.obs_buf.any()
        np.testing.assert_array_equal(trainer.obs_buf.numpy(), trainer.host_obs)
    finally:
        trainer.close()


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_ppo_numpy_acting_fills_the_storage_of_the_torch_path(env: str) -> None:
    torch_path, numpy_path = ppo(f"env.id={env}", *PPO_OFF), ppo(f"env.id={env}", *PPO_ON)
    try:
        torch_path.collect()
        numpy_path.collect()
        for name in ("obs_buf", "actions_buf", "rewards_buf", "terminated_buf", "truncated_buf", "valid_buf"):
            torch.testing.assert_close(getattr(numpy_path, name), getattr(torch_path, name), **FP_REORDER)
        for name in ("logprobs_buf", "values_buf"):
            torch.testing.assert_close(getattr(numpy_path, name), getattr(torch_path, name), **FP_REORDER)
        assert numpy_path.actions_buf.dtype == torch_path.actions_buf.dtype
    finally:
        torch_path.close()
        numpy_path.close()


@pytest.mark.parametrize("paths", [[], ["optimizations.batch_inference=true"], ["optimizations.lean_rollout=true"],
                                   ["optimizations.batch_inference=true", "optimizations.inference_batch_size=1"],
                                   ["optimizations.batch_inference=true", "optimizations.lean_rollout=true"]])
def test_ppo_numpy_acting_keeps_fp_reorder_parity(paths: list[str]) -> None:
    plain, _ = ppo_params_after(*paths, "optimizations.numpy_acting=false")
    fast, trainer = ppo_params_after(*paths, "optimizations.numpy_acting=true")
    assert trainer.config.optimizations.numpy_acting is True
    assert_params_close(fast, plain, **FP_REORDER)


@pytest.mark.parametrize("batched, calls", [(False, 2), (True, 1)])
def test_numpy_acting_runs_one_forward_per_sub_env_unless_batched(monkeypatch: pytest.MonkeyPatch, batched: bool,
                                                                 calls: int) -> None:
    """``batch_inference`` still decides the batching: per sub-env (plain) or one forward for all."""
    rows: list[int] = []
    real = NumpyMLP.__call__
    monkeypatch.setattr(NumpyMLP, "__call__", lambda self, x: rows.append(x.shape[0]) or real(self, x))
    for trainer in (ppo(f"optimizations.batch_inference={str(batched).lower()}", "optimizations.numpy_acting=true",
                        "optimizations.stacked_mlps=true"),  # actor and critic as one forward
                    make("dqn", f"optimizations.batch_inference={str(batched).lower()}", "optimizations.numpy_acting=true")):
        try:
            rows.clear()
            trainer.select_actions(trainer.next_obs)
            assert len(rows) == calls and sum(rows) == trainer.num_envs == 2
        finally:
            trainer.close()


def test_ppo_numpy_acting_selects_actions_for_the_latency_probe() -> None:
    trainer = ppo(*PPO_ON)
    try:
        actions = trainer.select_actions(trainer.next_obs)
        assert actions.shape == (trainer.num_envs,) and actions.dtype == np.int64
    finally:
        trainer.close()


# --------------------------------------------------------------------------- DQN

def test_dqn_numpy_acting_acts_without_torch_forwards(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = make("dqn", *ON)
    try:
        def no_torch(*args: object) -> None:
            raise AssertionError("the torch Q-network ran for acting")
        monkeypatch.setattr(trainer, "q_values", no_torch)
        actions = trainer.select_actions(trainer.next_obs)
        assert actions.shape == (trainer.num_envs,) and set(actions.tolist()) <= {0, 1}
        for _ in range(5):
            trainer._env_step()
    finally:
        trainer.close()


def test_dqn_numpy_acting_is_greedy_where_epsilon_is_zero() -> None:
    trainer = make("dqn", *ON, "dqn.start_epsilon=0.0", "dqn.end_epsilon=0.0")
    try:
        obs = trainer.next_obs
        with torch.no_grad():
            expected = trainer.model(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1).numpy()
        np.testing.assert_array_equal(trainer.select_actions(obs), expected)
    finally:
        trainer.close()


def test_dqn_numpy_acting_keeps_fp_reorder_parity() -> None:
    plain, _, _ = train("dqn", "optimizations.batch_inference=true", iterations=2)
    fast, _, trainer = train("dqn", *ON, iterations=2)
    assert trainer.config.optimizations.numpy_acting is True
    assert_params_close(fast, plain, **FP_REORDER)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("block", [1, 16])
def test_host_noise_gives_the_per_step_draws(rows: int, block: int) -> None:
    """Blocks of draws (``block_noise``) hand out, step by step and across a block's end, what one
    torch call per step (a block of one, the plain path) gives from the same generators."""
    from reference_trainers.value.acting import HostNoise

    steps = 2 * block + 5
    noise = HostNoise(rows, 3, torch.Generator().manual_seed(1), torch.Generator().manual_seed(2), block)
    explore, action = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    for _ in range(steps):
        uniform, random_action = noise.next()
        np.testing.assert_array_equal(uniform, torch.rand(rows, generator=explore).numpy())
        np.testing.assert_array_equal(random_action, torch.randint(3, (rows,), generator=action).numpy())
        assert uniform.dtype == np.float32 and random_action.dtype == np.int64


def test_dqn_numpy_acting_chooses_the_actions_of_the_torch_path() -> None:
    """Same draws, same greedy choice: the NumPy path acts as the batched torch path does, step by
    step (weights fixed, so the forwards agree to the last bit that decides an argmax here)."""
    fast, plain = make("dqn", *ON), make("dqn", "optimizations.batch_inference=true")
    try:
        obs = np.asarray(fast.next_obs, dtype=np.float32)
        for step in range(300):
            fast.agent_steps = plain.agent_steps = 30 * step  # epsilon from 1.0 down through the decay
            np.testing.assert_array_equal(fast.select_actions(obs), plain.select_actions(obs))
    finally:
        fast.close()
        plain.close()


def test_dqn_numpy_acting_follows_loaded_weights() -> None:
    source, target = make("dqn", *ON), make("dqn", *ON)  # the source trains, the target is fresh
    try:
        source.iterate()
        target.load_state_dict(source.state_dict())
        obs = np.asarray(source.next_obs, dtype=np.float32)
        with torch.no_grad():
            expected = source.model(torch.as_tensor(obs)).numpy()
        np.testing.assert_allclose(target.numpy_path.q_network(obs), expected, **FP_REORDER)
    finally:
        source.close()
        target.close()


# --------------------------------------------------------------------------- configuration

def test_auto_turns_numpy_acting_on_for_cpu_mlp_policies() -> None:
    for extra in (["algo=ppo", "optimizations.lean_rollout=true"], ["algo=dqn"]):
        res = resolve_config(build_config({}, TINY + extra + ["optimizations.batch_inference=true",
                                                              "optimizations.numpy_acting=auto"]))
        assert res.config.optimizations.numpy_acting is True
        assert "NumPy" in res.reasons["optimizations.numpy_acting"]


@pytest.mark.parametrize("extra, reason", [
    (["algo=iqn"], "not 'iqn'"),
    (["optimizations.amp=true"], "float32"),
    (["optimizations.matmul_precision=medium"], "float32"),
    (["optimizations.compile_model=true"], "compile_model"),
    (["model.recurrent=lstm"], "hidden state"),
])
def test_numpy_acting_true_is_refused_where_it_cannot_run(extra: list[str], reason: str) -> None:
    overrides = TINY + PPO_ON + extra
    with pytest.raises(ConfigError, match=f"numpy_acting: true .*{reason}"):
        resolve_config(build_config({}, overrides))


def test_numpy_acting_auto_stays_off_where_it_cannot_run() -> None:
    res = resolve_config(build_config({}, TINY + ["optimizations.numpy_acting=auto", "optimizations.amp=true"]))
    assert res.config.optimizations.numpy_acting is False
    assert "float32" in res.reasons["optimizations.numpy_acting"]


def test_cli_refuses_numpy_acting_under_autocast(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "ppo-cartpole", "--variant", "optimized", "--set", "optimizations.amp=true",
                 "--set", "optimizations.numpy_acting=true", "--steps", "64", "--repeats", "1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "numpy_acting" in err and "Traceback" not in err
