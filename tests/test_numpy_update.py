"""Tests for ``optimizations.numpy_update``: the hand-written minibatch step of PPO and DQN in NumPy.

Each piece is compared with the torch hand-written step it replaces (``ppo.ppo_loss_grads``,
``mlp_maths.mlp_forward``/``mlp_backward``, the learner's clipping), and whole training runs
with and without it end within the fp-reorder tolerance. That the path is taken:
tests/test_flag_effects_ppo.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TINY
from flag_resolution import assert_auto_resolves, assert_refused
from test_analytic import trained
from ppo_loss_inputs import LOSS_INPUTS, loss_inputs
from hypothesis import given, settings
from hypothesis import strategies as st
from value_trainers import assert_params_close, make

from harness.stats.parity import FP_REORDER as FP_REORDER_CLASS
from harness.stats.parity import TOLERANCES
from reference_trainers.nets import mlp as mlp_maths
from reference_trainers.paths import numpy_update
from reference_trainers.config.schema import build_config
from reference_trainers.paths.learner import flat_gradients
from reference_trainers.nets.networks import mlp
from reference_trainers.ppo.loss import PPOLossCoefs, ppo_loss_grads, ppo_loss_grads_numpy
from reference_trainers.ppo.minibatches import host_packed_gather, packed_gather
from reference_trainers.ppo.trainer import PPOTrainer

FP_REORDER = {"rtol": TOLERANCES[FP_REORDER_CLASS].rtol, "atol": TOLERANCES[FP_REORDER_CLASS].atol}
ON = ["optimizations.analytic_grads=true", "optimizations.numpy_update=true"]
OFF = ["optimizations.analytic_grads=true", "optimizations.numpy_update=false"]


@settings(max_examples=60, deadline=None)
@given(**LOSS_INPUTS, norm_adv=st.booleans(), clip_vloss=st.booleans())
def test_numpy_ppo_loss_grads_match_the_torch_ones(rows: int, actions: int, seed: int, near_old: bool, masked: float, norm_adv: bool,
                                                   clip_vloss: bool) -> None:
    logits, values, batch = loss_inputs(rows, actions, seed, near_old, masked)
    cfg = PPOLossCoefs(clip_coef=0.2, clip_vloss=clip_vloss, ent_coef=0.01, vf_coef=0.5, norm_adv=norm_adv)
    loss, stats, grad_logits, grad_values = ppo_loss_grads(logits, values, *batch, cfg)
    scalars, host_logits, host_values = ppo_loss_grads_numpy(
        logits.numpy(), values.numpy(), *(x.numpy() for x in batch), np.float32(0.2), clip_vloss, np.float32(0.01),
        np.float32(0.5), norm_adv)
    for array in (scalars, host_logits, host_values):
        assert array.dtype == np.float32
    torch.testing.assert_close(torch.from_numpy(host_logits), grad_logits, **FP_REORDER)
    torch.testing.assert_close(torch.from_numpy(host_values), grad_values, **FP_REORDER)
    expected = torch.stack([loss, *(stats[name] for name in numpy_update.STAT_NAMES[:-1])])
    torch.testing.assert_close(torch.from_numpy(scalars), expected, **FP_REORDER)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_host_mlp_forward_and_backward_match_the_torch_hand_written_ones(activation: str) -> None:
    torch.manual_seed(0)
    net = mlp(5, [16, 12], 3, activation, out_std=1.0)
    flat = flat_gradients(list(net.parameters()))
    x, grad_out = torch.randn(9, 5), torch.randn(9, 3)
    with torch.no_grad():
        expected_out, saved = mlp_maths.mlp_forward(net, x)
        mlp_maths.mlp_backward(saved, grad_out)
    expected = flat.clone()
    flat.zero_()
    host = mlp_maths.HostMLP(net)
    out, inputs = host.forward(x.numpy().copy())
    host.backward(inputs, grad_out.numpy())
    torch.testing.assert_close(torch.from_numpy(out), expected_out, **FP_REORDER)
    torch.testing.assert_close(flat, expected, **FP_REORDER)  # written through the views, into the flat buffer


def test_host_mlp_needs_the_gradient_tensors_to_write_into() -> None:
    with pytest.raises(ValueError, match="existing gradient tensors"):
        mlp_maths.HostMLP(mlp(3, [4], 2, "tanh", out_std=1.0))


@pytest.mark.parametrize("extra", [[], ["ppo.norm_adv=false", "ppo.clip_vloss=true"], ["env.id=Acrobot-v1"],
                                   ["model.activation=relu"], ["stability.max_grad_norm=null"],
                                   ["stability.max_grad_norm=1e-3"]])
def test_numpy_update_trains_like_the_torch_hand_written_step(extra: list[str]) -> None:
    plain, plain_stats = trained(*OFF, *extra)
    fast, fast_stats = trained(*ON, *extra)
    assert_params_close(fast, plain, **FP_REORDER)
    assert fast_stats.keys() == plain_stats.keys()
    for name in plain_stats:
        assert fast_stats[name] == pytest.approx(plain_stats[name], rel=1e-4, abs=1e-6), name


@pytest.mark.parametrize("env", ["CartPole-v1", "Acrobot-v1"])
def test_the_host_packed_gather_selects_the_rows_the_torch_one_does(env: str) -> None:
    """Bit for bit: the NumPy step's minibatch columns are the torch packed gather's rows."""
    t = PPOTrainer(build_config({}, TINY + ON + [f"env.id={env}"]))
    try:
        t.collect()
        rows = t.obs_buf.shape[0] * t.obs_buf.shape[1]
        batch = (t.obs_buf.flatten(0, 1), t.actions_buf.flatten(0, 1), t.logprobs_buf.flatten(),
                 torch.randn(rows), torch.randn(rows), t.values_buf.flatten(), t.valid_buf.flatten())
        idx = torch.randperm(rows)[: rows // 2]
        host = host_packed_gather(batch)(idx)
        expected = packed_gather(batch)(idx)
        assert len(host) == len(expected)
        for got, want in zip(host, expected):
            assert isinstance(got, np.ndarray) and got.dtype == np.float32
            assert torch.equal(torch.from_numpy(np.ascontiguousarray(got)), want.float())
    finally:
        t.close()


def test_numpy_update_clips_the_flat_gradients_and_reports_the_norm_before() -> None:
    t = PPOTrainer(build_config({}, TINY + ON + ["stability.max_grad_norm=1e-4"]))
    try:
        t.collect()
        t.update()
        step = t.learner.loss
        batch = (t.obs_buf.flatten(0, 1), t.actions_buf.flatten().float(), t.logprobs_buf.flatten(),
                 torch.ones(t.valid_buf.numel()), t.values_buf.flatten(), t.values_buf.flatten(), t.valid_buf.flatten())
        loss, stats, norm = step(*batch)
        assert norm > 1e-3  # far above the bound: the gradients were scaled down to it
        assert torch.linalg.vector_norm(t.learner.flat_grad).item() == pytest.approx(1e-4, rel=1e-3)
        assert stats["nonfinite"].item() == 0.0
        assert all(value.dtype == torch.float32 and value.ndim == 0 for value in (loss, norm, *stats.values()))
        bad = (batch[0] * float("nan"), *batch[1:])
        assert step(*bad)[1]["nonfinite"].item() == 1.0
    finally:
        t.close()


@pytest.mark.parametrize("extra", [[], ["dqn.double_q=true"], ["dqn.prioritized_replay=true"], ["dqn.n_step=3"],
                                   ["model.activation=tanh"], ["stability.max_grad_norm=1e-3"],
                                   ["optimizations.replay=tensor"],
                                   ["optimizations.replay=tensor", "dqn.prioritized_replay=true", "dqn.double_q=true"]])
def test_numpy_update_trains_dqn_like_the_torch_hand_written_step(extra: list[str]) -> None:
    results = []
    for flags in (OFF, ON):
        t = make("dqn", *flags, *extra)
        try:
            for _ in range(4):
                t.iterate()
            assert t.updates > 0
            priorities = t.replay.state_dict()["sampler"].get("sums") if "dqn.prioritized_replay=true" in extra else None
            results.append(({k: p.detach().clone() for k, p in t.model.named_parameters()}, dict(t.last_stats),
                            priorities))
        finally:
            t.close()
    (plain, plain_stats, plain_priorities), (fast, fast_stats, fast_priorities) = results
    assert_params_close(fast, plain, **FP_REORDER)
    assert fast_stats.keys() == plain_stats.keys()
    for name in plain_stats:
        assert fast_stats[name] == pytest.approx(plain_stats[name], rel=1e-4, abs=1e-6), name
    if plain_priorities is not None:  # PER: the per-sample |TD error| the NumPy step hands back
        torch.testing.assert_close(fast_priorities, plain_priorities, **FP_REORDER)


@pytest.mark.parametrize("replay", ["list", "tensor"])
def test_host_gather_hands_the_dqn_step_the_rows_the_torch_gather_does(replay: str) -> None:
    """Tensor replay in host memory: NumPy arrays, bit for bit the torch gather's rows; list
    replay has no host view and gathers as before."""
    t = make("dqn", *ON, f"optimizations.replay={replay}", "dqn.prioritized_replay=true")
    try:
        while not t.updates:
            t.iterate()
        indices, weights = t.replay.draw(t.hp.batch_size, t._beta())
        host, expected = t.replay.host_gather(indices, weights), t.replay.gather(indices, weights)
        for name, got, want in zip(host._fields, host, expected):
            if replay == "tensor" and name != "indices":
                assert isinstance(got, np.ndarray), name
                assert torch.equal(torch.from_numpy(np.ascontiguousarray(got)), want), name
            else:
                assert isinstance(got, torch.Tensor) and torch.equal(got, want), name
    finally:
        t.close()


def test_numpy_dqn_step_reports_a_non_finite_loss() -> None:
    t = make("dqn", *ON)
    try:
        while not t.updates:
            t.iterate()
        sample = t.replay.gather(*t.replay.draw(t.hp.batch_size, t._beta()))
        obs, *rest = t.train_batch(sample)
        loss, stats, norm = t.learner.loss(obs, *rest)
        assert stats["nonfinite"].item() == 0.0 and torch.isfinite(loss) and stats["priority"].shape == (len(obs),)
        assert all(value.dtype == torch.float32 for value in (loss, norm, *stats.values()))
        assert t.learner.loss(obs * float("nan"), *rest)[1]["nonfinite"].item() == 1.0
    finally:
        t.close()


@pytest.mark.parametrize(("overrides", "message"), [
    (["optimizations.analytic_grads=false"], "needs analytic_grads"),
    (["optimizations.analytic_grads=true", "optimizations.compile_train_step=true"], "compile_train_step compiles"),
    (["optimizations.analytic_grads=true", "optimizations.matmul_precision=medium"], "matmul_precision 'medium'"),
    (["algo=iqn"], "has no effect for algo 'iqn'"),
])
def test_numpy_update_true_is_rejected_where_it_cannot_run(overrides: list[str], message: str) -> None:
    assert_refused("numpy_update", overrides, message)


@pytest.mark.parametrize(("overrides", "expected"), [
    (["optimizations.analytic_grads=auto"], True), (["optimizations.analytic_grads=false"], False),
    (["optimizations.analytic_grads=true", "optimizations.compile_train_step=true"], False),
])
def test_numpy_update_auto_resolves_where_it_applies(overrides: list[str], expected: bool) -> None:
    assert_auto_resolves("numpy_update", overrides, expected)
