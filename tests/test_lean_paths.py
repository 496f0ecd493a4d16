"""Tests for the lean hot paths: PPO's ``lean_rollout`` (host-staged rollout scalars) beside
``fused_gae`` and ``packed_gather`` (tests/test_unbundled_ppo_iqn.py holds their effect tests),
inverse-CDF action sampling, foreach gradient clipping, the one-sub-env vectorization choice and
the CPU tensor replay's in-place inserts.

Each optimised path is checked to be taken (so the flag does something) and to keep its
parity class against the plain path from the same seed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TINY
from value_trainers import assert_params_close
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.stats.parity import FP_REORDER as FP_REORDER_CLASS
from harness.stats.parity import TOLERANCES
from reference_trainers.config.schema import ConfigError, build_config
from reference_trainers.config.resolve import resolve_config
from reference_trainers.paths.speedups import clip_grad_norm
from reference_trainers.ppo.trainer import PPOTrainer, action_noise, compute_gae, compute_gae_fused, sample_action

FP_REORDER = {"rtol": TOLERANCES[FP_REORDER_CLASS].rtol, "atol": TOLERANCES[FP_REORDER_CLASS].atol}
LEAN_PATHS = [f"optimizations.{name}=true" for name in ("lean_rollout", "stacked_mlps", "fused_gae", "packed_gather")]


def ppo_trainer(*overrides: str) -> PPOTrainer:
    return PPOTrainer(build_config({}, TINY + list(overrides)))


def params_after(*overrides: str, iterations: int = 2) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    trainer = ppo_trainer(*overrides)
    try:
        before = {k: p.detach().clone() for k, p in trainer.model.named_parameters()}
        for _ in range(iterations):
            trainer.iterate()
        after = {k: p.detach().clone() for k, p in trainer.model.named_parameters()}
        assert any(not torch.equal(before[k], after[k]) for k in before), "training did not move the parameters"
        return after, dict(trainer.last_stats)
    finally:
        trainer.close()


# --------------------------------------------------------------------------- sampling

def test_categorical_sampling_takes_the_first_action_whose_cumulative_probability_reaches_u() -> None:
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]] * 5))
    u = torch.tensor([0.0, 0.19, 0.21, 0.69, 0.999999])
    action, logprob = sample_action(logits, None, u)
    assert action.tolist() == [0, 0, 1, 1, 2]
    torch.testing.assert_close(logprob, torch.log(torch.tensor([0.2, 0.2, 0.5, 0.5, 0.3])))


@settings(max_examples=10, deadline=None)
@given(actions=st.integers(2, 18), seed=st.integers(0, 2**16))
def test_categorical_sampling_draws_each_action_with_its_probability(actions: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(actions, generator=generator), -1)
    rows = 40_000
    noise = action_noise(rows, True, (), generator, torch.device("cpu"))
    action, _ = sample_action(probs.log().expand(rows, -1), None, noise)
    frequencies = torch.bincount(action, minlength=actions).float() / rows
    torch.testing.assert_close(frequencies, probs, atol=0.012, rtol=0)  # 5 sigma of a frequency at p = 0.5


@pytest.mark.parametrize("discrete", [True, False])
def test_a_rows_action_depends_only_on_its_own_noise(discrete: bool) -> None:
    """Per-env, chunked and batched inference sample the same actions from one step's noise."""
    generator = torch.Generator().manual_seed(5)
    actor_out = torch.randn(6, 3, generator=generator)
    log_std = None if discrete else torch.zeros(3)
    noise = action_noise(6, discrete, () if discrete else (3,), generator, torch.device("cpu"))
    whole = sample_action(actor_out, log_std, noise)
    rows = [sample_action(actor_out[i:i + 1], log_std, noise[i:i + 1]) for i in range(6)]
    for batched, per_row in zip(whole, zip(*rows)):
        torch.testing.assert_close(batched, torch.cat(per_row), rtol=0, atol=0)


# --------------------------------------------------------------------------- fused GAE

@settings(max_examples=40, deadline=None)
@given(steps=st.integers(1, 40), envs=st.integers(1, 6), seed=st.integers(0, 2**16),
       gamma=st.floats(0.5, 1.0), lam=st.floats(0.0, 1.0))
def test_fused_gae_matches_the_plain_loop(steps: int, envs: int, seed: int, gamma: float, lam: float) -> None:
    rng = np.random.default_rng(seed)
    flags = lambda p: torch.from_numpy((rng.random((steps, envs)) < p).astype(np.float32))  # noqa: E731
    rewards = torch.from_numpy(rng.normal(size=(steps, envs)).astype(np.float32))
    values = torch.from_numpy(rng.normal(size=(steps, envs)).astype(np.float32))
    next_value = torch.from_numpy(rng.normal(size=envs).astype(np.float32))
    terminated, truncated, valid = flags(0.1), flags(0.05), 1.0 - flags(0.1)
    plain = compute_gae(rewards, values, next_value, terminated, truncated, valid, gamma, lam)
    fused = compute_gae_fused(rewards, values, next_value, terminated, truncated, valid, gamma, lam)
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, **FP_REORDER)
    assert torch.all(fused[0][valid == 0] == 0)


# --------------------------------------------------------------------------- foreach clipping

@pytest.mark.parametrize("max_norm", [0.05, 1e3])
def test_foreach_clip_matches_torch(max_norm: float) -> None:
    gen = torch.Generator().manual_seed(3)
    shapes = [(64, 4), (64,), (64, 64), (2, 64), (2,)]
    plain = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    fast = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for p, q in zip(plain, fast):
        p.grad = torch.randn(p.shape, generator=gen)
        q.grad = p.grad.clone()
    norm_plain = clip_grad_norm(plain, max_norm, foreach=False)
    norm_fast = clip_grad_norm(fast, max_norm, foreach=True)
    torch.testing.assert_close(norm_fast, norm_plain, **FP_REORDER)
    for p, q in zip(plain, fast):
        torch.testing.assert_close(q.grad, p.grad, **FP_REORDER)
    clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(q.grad) for q in fast]))
    assert clipped <= max_norm * (1 + 1e-5) or max_norm > norm_plain


@pytest.mark.parametrize("impl", ["forloop", "foreach", "fused"])
@pytest.mark.parametrize("foreach", [False, True])
def test_foreach_grad_clip_alone_picks_the_clipping_path(monkeypatch: pytest.MonkeyPatch, impl: str,
                                                          foreach: bool) -> None:
    """The clipping path is its own flag: the Adam implementation does not choose it."""
    calls: list[bool] = []
    import reference_trainers.paths.learner as learner_mod
    real = learner_mod.clip_grad_norm
    monkeypatch.setattr(learner_mod, "clip_grad_norm", lambda p, m, f: calls.append(f) or real(p, m, f))
    trainer = ppo_trainer(f"optimizations.optimizer_impl={impl}", f"optimizations.foreach_grad_clip={str(foreach).lower()}")
    try:
        trainer.iterate()
    finally:
        trainer.close()
    assert calls and set(calls) == {foreach}


# --------------------------------------------------------------------------- lean_rollout

def test_lean_rollout_stages_the_rollout_scalars_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flag stages rollout scalars on the host; the fused GAE and the packed gather stay off
    (flags of their own) until asked for."""
    import reference_trainers.ppo.minibatches as minibatches
    used: list[str] = []
    monkeypatch.setattr(minibatches, "packed_gather",
                        lambda batch, real=minibatches.packed_gather: used.append("packed") or real(batch))
    for lean in (False, True):
        trainer = ppo_trainer(f"optimizations.lean_rollout={str(lean).lower()}")
        try:
            trainer.iterate()
            assert trainer.gae is compute_gae
            assert bool(trainer.host_scalars[1].any()) is lean  # rewards staged on the host only when lean
            assert torch.equal(trainer.rewards_buf.cpu(), torch.ones_like(trainer.rewards_buf.cpu()) * trainer.valid_buf.cpu())
        finally:
            trainer.close()
    assert used == []


@pytest.mark.parametrize("extra", [[], ["optimizations.batch_inference=true"], ["env.id=Pendulum-v1"],
                                   ["optimizations.num_workers=1"]])
def test_the_rollout_and_update_flags_together_keep_fp_reorder_parity(extra: list[str]) -> None:
    """``lean_rollout``, ``stacked_mlps``, ``fused_gae`` and ``packed_gather`` all on, against all off."""
    plain, plain_stats = params_after(*extra)
    lean, lean_stats = params_after(*LEAN_PATHS, *extra)
    assert_params_close(lean, plain, **FP_REORDER)
    for name in plain_stats:
        assert lean_stats[name] == pytest.approx(plain_stats[name], rel=1e-4, abs=1e-6), name


@pytest.mark.parametrize("acting", [[], ["optimizations.batch_inference=true"],
                                    ["optimizations.batch_inference=true", "optimizations.numpy_acting=true"]])
def test_lean_rollout_fills_the_same_storage_as_the_plain_collect(acting: list[str]) -> None:
    """Bit for bit: the same acting, only the storage written once per rollout instead of per step."""
    plain, lean = ppo_trainer(*acting), ppo_trainer("optimizations.lean_rollout=true", *acting)
    try:
        plain.collect()
        lean.collect()
        for name in ("obs_buf", "actions_buf", "logprobs_buf", "values_buf", "rewards_buf", "terminated_buf",
                     "truncated_buf", "valid_buf"):
            assert torch.equal(getattr(lean, name), getattr(plain, name)), name
    finally:
        plain.close()
        lean.close()


def test_lean_rollout_is_rejected_for_value_based_algos() -> None:
    config = build_config({"algo": "dqn"}, TINY + ["optimizations.lean_rollout=true"])
    with pytest.raises(ConfigError, match="optimizations.lean_rollout: true has no effect for algo 'dqn'"):
        resolve_config(config)


# --------------------------------------------------------------------------- value-based acting and replay

def test_vectorization_auto_is_serial_below_native_min_envs() -> None:
    from reference_trainers.envs.factory import resolve_vectorization
    assert resolve_vectorization("CartPole-v1", "auto", num_envs=1).mode == "serial"
    assert resolve_vectorization("CartPole-v1", "auto", num_envs=4).mode == "native"
    assert resolve_vectorization("CartPole-v1", "auto", num_envs=4, native_min_envs=6).mode == "serial"
    assert resolve_vectorization("CartPole-v1", "native", num_envs=1).mode == "native"  # explicit requests stand
    config = build_config({"algo": "dqn"}, ["device=cpu", "env.num_envs=1", "env.vectorization=auto"])
    assert resolve_config(config).config.env.vectorization == "serial"
    for envs, mode in ((4, "serial"), (5, "serial"), (6, "native"), (64, "native")):
        res = resolve_config(build_config({}, ["device=cpu", f"env.num_envs={envs}", "env.vectorization=auto"]))
        assert res.config.env.vectorization == mode, envs
    res = resolve_config(build_config({}, ["device=cpu", "env.num_envs=4", "env.vectorization=auto",
                                           "tuning.native_min_envs=2"]))
    assert res.config.env.vectorization == "native"
    assert "tuning.native_min_envs" in resolve_config(
        build_config({}, ["device=cpu", "env.num_envs=4", "env.vectorization=auto"])).reasons["env.vectorization"]


def test_tensor_replay_on_cpu_writes_through_its_host_view() -> None:
    from reference_trainers.replay.buffers import TensorStorage
    from reference_trainers.replay.writers import TransitionBatch
    from reference_trainers.paths.speedups import HostToDevice
    storage = TensorStorage(5, 2, torch.device("cpu"), HostToDevice(torch.device("cpu")))
    storage.to_device = lambda *a, **k: pytest.fail("the CPU insert went through a host->device copy")  # type: ignore[assignment]
    assert np.shares_memory(storage.host_rows, storage.rows.numpy())
    rng = np.random.default_rng(0)
    rows = []
    for start, count in ((0, 3), (3, 4)):  # the second insert wraps around the ring
        batch = TransitionBatch(rng.normal(size=(count, 2)).astype(np.float32), rng.integers(0, 3, count),
                                rng.normal(size=count).astype(np.float32), rng.normal(size=(count, 2)).astype(np.float32),
                                np.full(count, 0.99, dtype=np.float32))
        storage.write(start, batch)
        rows.append(batch)
    last = rows[-1]
    obs, actions, rewards, next_obs, bootstrap = storage.gather(torch.tensor([3, 4, 0, 1]))
    np.testing.assert_array_equal(obs.numpy(), last.obs)
    np.testing.assert_array_equal(actions.numpy(), last.actions)
    np.testing.assert_array_equal(rewards.numpy(), last.rewards)
    np.testing.assert_array_equal(next_obs.numpy(), last.next_obs)
    assert actions.dtype == torch.int64


# --------------------------------------------------------------------------- MLP forward

@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_mlp_forward_matches_calling_each_layer(activation: str) -> None:
    from reference_trainers.nets.networks import MLP, mlp
    net = mlp(4, [16, 8], 3, activation, out_std=1.0)
    assert isinstance(net, MLP)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    layer_by_layer = x
    for layer in net:
        layer_by_layer = layer(layer_by_layer)
    assert torch.equal(net(x), layer_by_layer)
    calls: list[str] = []
    net[0].register_forward_hook(lambda *_: calls.append("layer"))
    net.register_forward_hook(lambda *_: calls.append("mlp"))
    net(x)
    assert calls == ["mlp"]  # one module call for the whole stack
