"""Tests for the PPO reference trainer (reference_trainers/ppo/trainer.py) and the speed-up helpers it uses.

What is proved here, each flag against its plain path:
- the pure maths: ``compute_gae`` on hand-computed rollouts (NEXT_STEP autoreset semantics) and
  ``ppo_loss`` masking;
- each optimisation changes the code path it claims (call counts, spies, hooks) and keeps its parity
  class from the same seed (exact, fp-reorder, reduced precision);
- stability: ``nan_policy``, gradient clipping, float32 only, compile fallback;
- continuous and other discrete envs, thread settings, ``select_actions``;
- CUDA / MPS variants where such a device exists; a slow learning check on the shipped preset.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from conftest import TINY
from matmul_dtypes import MatmulDtypes
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import reference_trainers.ppo.trainer as ppo_mod
from flag_effects import tensor_calls
from reference_trainers import NonFiniteError
from reference_trainers.runtime import device as dev
from reference_trainers.config.schema import build_config
from reference_trainers.paths.training_stats import ItemStats, SyncFreeStats
from reference_trainers.ppo.loss import PPOLossCoefs, ppo_loss
from reference_trainers.ppo.trainer import PPOTrainer, compute_gae

CUDA = torch.cuda.is_available()
MPS = dev.mps_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
needs_mps = pytest.mark.skipif(not MPS, reason="needs an Apple MPS device")


# --------------------------------------------------------------------------- helpers

def make_trainer(*overrides: str) -> PPOTrainer:
    """A tiny PPO trainer (CartPole, 2 envs x 16 steps, 2 minibatches, 1 epoch) with extra ``--set``s."""
    return PPOTrainer(build_config({}, TINY + list(overrides)))


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def train_once(*overrides: str, iterations: int = 1) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Parameters (on the CPU) and ``last_stats`` after ``iterations`` iterations from the config's seed.

    Asserts that training moved the parameters, so parity between two runs is never the trivial one.
    """
    trainer = make_trainer(*overrides)
    try:
        before = snapshot(trainer.model)
        for _ in range(iterations):
            trainer.iterate()
        after = snapshot(trainer.model)
        assert any(not torch.equal(before[k], after[k]) for k in before), "iterate() did not change any parameter"
        return {k: v.cpu() for k, v in after.items()}, dict(trainer.last_stats)
    finally:
        trainer.close()


def assert_params_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rtol: float, atol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def assert_params_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs: max abs diff {(a[name] - b[name]).abs().max()}"


def all_finite(params: dict[str, torch.Tensor], stats: dict[str, float]) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in params.values()) and all(math.isfinite(v) for v in stats.values())


class CountingForward:
    """Stands in for ``trainer.forward``: records the batch size of each call, then calls through."""

    def __init__(self, forward: Any) -> None:
        self.forward = forward
        self.batch_sizes: list[int] = []

    def __call__(self, obs: torch.Tensor) -> Any:
        self.batch_sizes.append(int(obs.shape[0]))
        return self.forward(obs)


class WideDtypeOps(TorchDispatchMode):
    """Records every dispatched op that touches a float64/complex128 tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        flat = tree_flatten((args, kwargs, out))[0]
        if any(isinstance(t, torch.Tensor) and t.dtype in (torch.float64, torch.complex128) for t in flat):
            self.ops.append(str(func))
        return out


def rlgauge_warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "rlgauge" and r.levelno == logging.WARNING and text in r.getMessage()]


# --------------------------------------------------------------------------- compute_gae (hand-computed)
#
# Both columns: rewards r = [1, 2, 3, 4], values V = [0.5, 1.0, 1.5, 2.0], bootstrap value 3.0,
# gamma = 0.5, lambda = 0.5 (so gamma * lambda = 0.25 and every number below is exact in float32).
# Textbook GAE: delta_t = r_t + gamma * V_{t+1} - V_t, A_t = delta_t + gamma * lambda * A_{t+1}:
#   delta_3 = 4 + 0.5*3.0 - 2.0 = 3.5     A_3 = 3.5
#   delta_2 = 3 + 0.5*2.0 - 1.5 = 2.5     A_2 = 2.5 + 0.25*3.5     = 3.375
#   delta_1 = 2 + 0.5*1.5 - 1.0 = 1.75    A_1 = 1.75 + 0.25*3.375  = 2.59375
#   delta_0 = 1 + 0.5*1.0 - 0.5 = 1.0     A_0 = 1.0 + 0.25*2.59375 = 1.6484375

GAMMA, LAM = 0.5, 0.5
TEXTBOOK = [1.6484375, 2.59375, 3.375, 3.5]


def gae_inputs() -> dict[str, torch.Tensor]:
    col = lambda values: torch.tensor(values, dtype=torch.float32)  # noqa: E731
    rewards = torch.stack([col([1, 2, 3, 4])] * 2, dim=1)
    values = torch.stack([col([0.5, 1.0, 1.5, 2.0])] * 2, dim=1)
    return {
        "rewards": rewards, "values": values, "next_value": col([3.0, 3.0]),
        "terminated": torch.zeros(4, 2), "truncated": torch.zeros(4, 2), "valid": torch.ones(4, 2),
    }


def run_gae(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_gae(inputs["rewards"], inputs["values"], inputs["next_value"], inputs["terminated"],
                       inputs["truncated"], inputs["valid"], GAMMA, LAM)


def expect_columns(advantages: torch.Tensor, returns: torch.Tensor, values: torch.Tensor,
                   col0: list[float], col1: list[float]) -> None:
    expected = torch.tensor([col0, col1], dtype=torch.float32).T
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(returns, expected + values, rtol=0, atol=1e-6)
    assert advantages.dtype == returns.dtype == torch.float32
    assert advantages.shape == returns.shape == (4, 2)


def test_gae_without_dones_is_textbook_gae() -> None:
    inputs = gae_inputs()
    inputs["rewards"][:, 1] = torch.tensor([0.0, 0.0, 0.0, 1.0])
    # column 1: r = [0, 0, 0, 1], same V, bootstrap 3.0
    #   delta_3 = 1 + 1.5 - 2 = 0.5   A_3 = 0.5
    #   delta_2 = 0 + 1.0 - 1.5 = -0.5  A_2 = -0.5 + 0.125 = -0.375
    #   delta_1 = 0 + 0.75 - 1 = -0.25  A_1 = -0.25 - 0.09375 = -0.34375
    #   delta_0 = 0 + 0.5 - 0.5 = 0     A_0 = 0 - 0.0859375 = -0.0859375
    advantages, returns = run_gae(inputs)
    expect_columns(advantages, returns, inputs["values"], TEXTBOOK, [-0.0859375, -0.34375, -0.375, 0.5])


def test_gae_terminated_step_neither_bootstraps_nor_continues_the_chain() -> None:
    inputs = gae_inputs()
    inputs["terminated"][1, 1] = 1.0
    # column 1 terminates at t=1: delta_1 = r_1 - V_1 = 2 - 1 = 1.0 (no gamma*V_2) and A_1 = delta_1
    # (no 0.25*A_2); A_0 = 1.0 + 0.25*1.0 = 1.25; t=2,3 unchanged.
    advantages, returns = run_gae(inputs)
    expect_columns(advantages, returns, inputs["values"], TEXTBOOK, [1.25, 1.0, 3.375, 3.5])


def test_gae_truncated_step_bootstraps_from_next_stored_value_but_cuts_the_chain() -> None:
    inputs = gae_inputs()
    inputs["truncated"][1, 1] = 1.0
    # Under NEXT_STEP the observation stored at t=2 is the final observation of the truncated
    # episode, so V_2 is the bootstrap value. Make it distinctive: V_2 = 7.
    inputs["values"][2, 1] = 7.0
    #   delta_3 = 3.5                    A_3 = 3.5
    #   delta_2 = 3 + 1.0 - 7 = -3       A_2 = -3 + 0.875 = -2.125
    #   delta_1 = 2 + 0.5*7 - 1 = 4.5    A_1 = 4.5 (chain cut: no 0.25*A_2)
    #   delta_0 = 1.0                    A_0 = 1.0 + 0.25*4.5 = 2.125
    advantages, returns = run_gae(inputs)
    expect_columns(advantages, returns, inputs["values"], TEXTBOOK, [2.125, 4.5, -2.125, 3.5])


def test_gae_reset_steps_get_zero_advantage_and_do_not_leak_into_earlier_steps() -> None:
    inputs = gae_inputs()
    # Real NEXT_STEP rollout: column 1 terminates at t=1; t=2 is the reset step (reward 0, its value
    # is that of the final observation, say 7), t=3 is the first step of the next episode.
    inputs["terminated"][1, 1] = 1.0
    inputs["rewards"][2, 1] = 0.0
    inputs["values"][2, 1] = 7.0
    inputs["valid"][2, 1] = 0.0
    #   A_3 = 3.5; A_2 = 0 (invalid); A_1 = 2 - 1 = 1.0; A_0 = 1.0 + 0.25*1.0 = 1.25
    advantages, returns = run_gae(inputs)
    expect_columns(advantages, returns, inputs["values"], TEXTBOOK, [1.25, 1.0, 0.0, 3.5])
    assert returns[2, 1] == inputs["values"][2, 1]  # zero advantage: the return is the value itself


def test_gae_invalid_step_zeroes_advantage_even_without_a_done_flag() -> None:
    inputs = gae_inputs()
    inputs["valid"][3, 1] = 0.0
    # A_3 = 0 (masked), and the running sum restarts from 0 for t=2:
    #   A_2 = 2.5; A_1 = 1.75 + 0.625 = 2.375; A_0 = 1.0 + 0.59375 = 1.59375
    advantages, returns = run_gae(inputs)
    expect_columns(advantages, returns, inputs["values"], TEXTBOOK, [1.59375, 2.375, 2.5, 0.0])


# --------------------------------------------------------------------------- ppo_loss masking

@pytest.mark.parametrize("norm_adv", [True, False])
@pytest.mark.parametrize("clip_vloss", [True, False])
def test_ppo_loss_ignores_masked_out_samples(norm_adv: bool, clip_vloss: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    n = 12
    rand = lambda: torch.randn(n, generator=gen)  # noqa: E731
    args = {"new_logprob": rand() * 0.1 - 0.7, "entropy": rand().abs(), "new_value": rand(),
            "old_logprob": rand() * 0.1 - 0.7, "advantages": rand(), "returns": rand(), "old_value": rand()}
    mask = torch.ones(n)
    mask[[1, 4, 5, 10]] = 0.0
    coefs = PPOLossCoefs(clip_coef=0.2, clip_vloss=clip_vloss, ent_coef=0.01, vf_coef=0.5, norm_adv=norm_adv)
    loss, stats = ppo_loss(**args, mask=mask, cfg=coefs)

    garbage = {k: v.clone() for k, v in args.items()}
    for k in garbage:
        garbage[k][mask == 0] = torch.tensor([1e3, -5e2, 77.0, -3e3])
    loss_g, stats_g = ppo_loss(**garbage, mask=mask, cfg=coefs)
    torch.testing.assert_close(loss_g, loss, rtol=1e-6, atol=1e-7)
    for k in stats:
        torch.testing.assert_close(stats_g[k], stats[k], rtol=1e-6, atol=1e-7)

    # The same change at a kept sample does change the loss (the check above is not vacuous).
    changed = {k: v.clone() for k, v in args.items()}
    changed["returns"][0] += 10.0
    changed["advantages"][0] += 10.0
    assert not torch.allclose(ppo_loss(**changed, mask=mask, cfg=coefs)[0], loss)


def test_ppo_loss_equals_the_loss_on_the_kept_samples_alone() -> None:
    gen = torch.Generator().manual_seed(1)
    n = 10
    rand = lambda: torch.randn(n, generator=gen)  # noqa: E731
    args = {"new_logprob": rand() * 0.1, "entropy": rand().abs(), "new_value": rand(), "old_logprob": rand() * 0.1,
            "advantages": rand(), "returns": rand(), "old_value": rand()}
    mask = torch.tensor([1, 0, 1, 1, 0, 1, 1, 1, 0, 1], dtype=torch.float32)
    coefs = PPOLossCoefs(0.2, True, 0.01, 0.5, True)
    loss, _ = ppo_loss(**args, mask=mask, cfg=coefs)
    keep = mask.bool()
    loss_kept, _ = ppo_loss(**{k: v[keep] for k, v in args.items()}, mask=torch.ones(int(keep.sum())), cfg=coefs)
    torch.testing.assert_close(loss, loss_kept, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- batch_inference / inference_batch_size

@pytest.mark.parametrize(
    ("overrides", "forwards_per_step", "batch_sizes", "cpu_calls_per_step"),
    [
        pytest.param([], 4, [1, 1, 1, 1], 4, id="per-env"),
        pytest.param(["optimizations.batch_inference=true"], 1, [4], 1, id="batched"),
        pytest.param(["optimizations.batch_inference=true", "optimizations.inference_batch_size=3"], 2, [3, 1], 1,
                     id="chunked-3"),
        pytest.param(["optimizations.batch_inference=true", "optimizations.inference_batch_size=2"], 2, [2, 2], 1,
                     id="chunked-2"),
        pytest.param(["optimizations.batch_inference=true", "optimizations.inference_batch_size=1"], 4, [1, 1, 1, 1], 1,
                     id="chunked-1"),
    ],
)
def test_batch_inference_controls_forwards_and_host_copies_per_step(
        monkeypatch: pytest.MonkeyPatch, overrides: list[str], forwards_per_step: int, batch_sizes: list[int],
        cpu_calls_per_step: int) -> None:
    trainer = make_trainer("env.num_envs=4", "ppo.num_steps=8", *overrides)
    try:
        counter = CountingForward(trainer.policy.forward)
        trainer.policy.forward = counter
        with tensor_calls("cpu") as calls:
            frames, decisions = trainer.collect()
        steps = trainer.config.ppo.num_steps
        assert (frames, decisions) == (steps * 4, steps * 4)
        assert len(counter.batch_sizes) == steps * forwards_per_step
        assert counter.batch_sizes == batch_sizes * steps
        assert calls["cpu"] == steps * cpu_calls_per_step
    finally:
        trainer.close()


# --------------------------------------------------------------------------- exact parity class

@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(["optimizations.batch_inference=true"], id="batch_inference"),
        pytest.param(["optimizations.batch_inference=true", "optimizations.inference_batch_size=1"],
                     id="inference_batch_size"),
        pytest.param(["env.vectorization=sync"], id="sync-vectorization"),
        pytest.param(["optimizations.sync_free_logging=true"], id="sync_free_logging"),
    ],
)
def test_exact_class_flags_keep_parameters_from_same_seed(overrides: list[str]) -> None:
    plain, plain_stats = train_once("env.vectorization=serial")
    fast, fast_stats = train_once("env.vectorization=serial", *overrides)
    assert_params_close(fast, plain, rtol=1e-6, atol=1e-6)
    assert fast_stats.keys() == plain_stats.keys()
    for k in plain_stats:
        assert math.isclose(fast_stats[k], plain_stats[k], rel_tol=1e-5, abs_tol=1e-7), k


def test_batch_inference_parity_holds_for_continuous_actions() -> None:
    plain, _ = train_once("env.id=Pendulum-v1")
    fast, _ = train_once("env.id=Pendulum-v1", "optimizations.batch_inference=true")
    assert_params_close(fast, plain, rtol=1e-6, atol=1e-6)


def test_sync_and_serial_vectorization_train_identically() -> None:
    serial, serial_stats = train_once("env.vectorization=serial", iterations=2)
    sync, sync_stats = train_once("env.vectorization=sync", iterations=2)
    assert_params_equal(sync, serial)
    assert sync_stats == serial_stats


def test_sync_free_logging_gives_identical_params_and_stats_within_1e6() -> None:
    plain, plain_stats = train_once(iterations=2)
    fast, fast_stats = train_once("optimizations.sync_free_logging=true", iterations=2)
    assert_params_equal(fast, plain)
    assert fast_stats.keys() == plain_stats.keys() and plain_stats
    for k in plain_stats:
        assert math.isclose(fast_stats[k], plain_stats[k], rel_tol=1e-6, abs_tol=1e-12), (k, fast_stats[k], plain_stats[k])


# --------------------------------------------------------------------------- optimizer_impl (fp-reorder)

ADAM_KERNELS = ("_single_tensor_adam", "_multi_tensor_adam", "_fused_adam")
ADAM_MODULE = importlib.import_module("torch.optim.adam")  # torch.optim.adam the attribute is shadowed


@pytest.mark.parametrize(
    ("impl", "foreach", "fused", "kernel"),
    [("forloop", False, False, "_single_tensor_adam"), ("foreach", True, None, "_multi_tensor_adam"),
     ("fused", None, True, "_fused_adam")],
)
def test_optimizer_impl_selects_the_adam_kernel(monkeypatch: pytest.MonkeyPatch, impl: str, foreach: bool | None,
                                                fused: bool | None, kernel: str) -> None:
    calls: Counter[str] = Counter()
    for name in ADAM_KERNELS:
        original = getattr(ADAM_MODULE, name)

        def spy(*args: Any, _name: str = name, _orig: Any = original, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _orig(*args, **kwargs)

        monkeypatch.setattr(ADAM_MODULE, name, spy)
    fused_kernel = torch._fused_adam_  # under direct_adam_step, called directly once the state exists
    monkeypatch.setattr(torch, "_fused_adam_", lambda *a, **k: calls.update(["kernel"]) or fused_kernel(*a, **k))
    trainer = make_trainer(f"optimizations.optimizer_impl={impl}")
    try:
        assert isinstance(trainer.learner.optimizer, torch.optim.Adam)
        assert trainer.learner.optimizer.defaults["foreach"] is foreach
        assert bool(trainer.learner.optimizer.defaults["fused"]) is bool(fused)
        result = trainer.iterate()
    finally:
        trainer.close()
    assert calls[kernel] == result.updates > 0  # every step through torch's wrapper (direct_adam_step is off)
    assert calls["kernel"] == (result.updates if impl == "fused" else 0)
    assert sum(calls[k] for k in ADAM_KERNELS if k != kernel) == 0, calls


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_optimizer_impl_params_match_forloop_within_fp_reorder(impl: str) -> None:
    plain, _ = train_once("optimizations.optimizer_impl=forloop", iterations=2)
    fast, stats = train_once(f"optimizations.optimizer_impl={impl}", iterations=2)
    assert_params_close(fast, plain, rtol=1e-5, atol=1e-7)
    assert all_finite(fast, stats)


# --------------------------------------------------------------------------- sync_free_logging (stats classes)

SYNC_METHODS = ("item", "cpu", "tolist", "numpy", "__float__")


def logged_values() -> dict[str, list[torch.Tensor]]:
    return {"loss": [torch.tensor(v, dtype=torch.float32) for v in (0.5, 1.25, -0.75, 2.0, 0.125)],
            "kl": [torch.tensor(v, dtype=torch.float32) for v in (1e-3, 3e-3, 2e-3)]}


def test_item_stats_syncs_once_per_added_value(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = ItemStats()
    with tensor_calls(*SYNC_METHODS) as calls:
        for name, values in logged_values().items():
            for v in values:
                stats.add(name, v)
    assert calls["item"] == 8
    means = stats.flush()
    assert means == pytest.approx({"loss": 0.625, "kl": 2e-3}, rel=1e-6)
    assert all(type(v) is float for v in means.values())


def test_sync_free_stats_add_never_syncs_and_flush_copies_to_host_once(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = SyncFreeStats(torch.device("cpu"))
    with tensor_calls(*SYNC_METHODS) as add_calls:
        for name, values in logged_values().items():
            for v in values:
                stats.add(name, v)
    assert sum(add_calls.values()) == 0, add_calls
    with tensor_calls(*SYNC_METHODS) as flush_calls:
        means = stats.flush()
    assert flush_calls["item"] == 0 and flush_calls["numpy"] == 0
    assert flush_calls["cpu"] == 1  # the one device->host copy, of all names stacked together
    assert flush_calls["tolist"] == 1
    assert means == pytest.approx({"loss": 0.625, "kl": 2e-3}, rel=1e-6)
    assert all(type(v) is float for v in means.values())
    # accumulators are reset by flush
    stats.add("loss", torch.tensor(4.0))
    stats.add("kl", torch.tensor(1.0))
    assert stats.flush() == {"loss": 4.0, "kl": 1.0}


def test_sync_free_stats_add_all_is_one_add_per_step_and_merges_with_add() -> None:
    """A step's statistics go in as one stacked add; flush still copies once and means per name."""
    plain, fast = ItemStats(), SyncFreeStats(torch.device("cpu"))
    steps = [{"loss": torch.tensor(float(i)), "kl": torch.tensor(0.5 * i)} for i in range(4)]
    for stats in (plain, fast):
        for step in steps:
            stats.add_all(step)
        stats.add("loss", torch.tensor(10.0))  # the same name through add: merged
    with tensor_calls("add_") as calls:
        fast.add_all(steps[0])
    assert calls["add_"] == 1
    plain.add_all(steps[0])
    with tensor_calls(*SYNC_METHODS) as flush_calls:
        means = fast.flush()
    assert flush_calls["cpu"] == 1
    assert means == pytest.approx({"loss": 16 / 6, "kl": 3 / 5}, rel=1e-6)
    assert plain.flush() == pytest.approx(means, rel=1e-6)
    fast.add_all({"kl": torch.tensor(2.0)})
    assert fast.flush() == {"kl": 2.0}  # only what came since the last flush


def test_sync_free_stats_flush_reports_only_names_added_since_last_flush() -> None:
    plain, fast = ItemStats(), SyncFreeStats(torch.device("cpu"))
    for stats in (plain, fast):
        stats.add("loss", torch.tensor(1.0))
        stats.add("kl", torch.tensor(2.0))
        stats.flush()
    assert plain.flush() == {}  # an empty interval
    assert fast.flush() == {}
    for stats in (plain, fast):
        stats.add("loss", torch.tensor(4.0))
    assert plain.flush() == {"loss": 4.0}
    assert fast.flush() == {"loss": 4.0}


def test_item_and_sync_free_stats_give_the_same_means() -> None:
    plain, fast = ItemStats(), SyncFreeStats(torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    for _ in range(50):
        for name in ("a", "b"):
            v = torch.rand((), generator=gen) + 0.5
            plain.add(name, v)
            fast.add(name, v)
    p, f = plain.flush(), fast.flush()
    assert p.keys() == f.keys()
    for k in p:
        assert math.isclose(p[k], f[k], rel_tol=1e-6)


@pytest.mark.parametrize(("sync_free", "expect_items"), [(False, True), (True, False)])
def test_sync_free_logging_removes_item_calls_from_the_update(monkeypatch: pytest.MonkeyPatch, sync_free: bool,
                                                              expect_items: bool) -> None:
    # fused Adam: the for-loop and foreach kernels call .item() on their CPU step counters themselves
    trainer = make_trainer(f"optimizations.sync_free_logging={str(sync_free).lower()}", "optimizations.optimizer_impl=fused")
    try:
        trainer.collect()
        with tensor_calls("item", "tolist", "__float__", "__bool__") as calls:
            updates = trainer.update()
            stats = trainer.learner.stats.flush()
    finally:
        trainer.close()
    logged_per_update = len(stats)  # policy_loss, value_loss, entropy, approx_kl, clip_fraction, nonfinite
    if expect_items:
        assert calls["item"] == updates * logged_per_update
    else:
        assert calls["item"] == 0
        assert calls["tolist"] == 1


# --------------------------------------------------------------------------- AMP

def test_amp_bfloat16_on_cpu_autocasts_forward_passes_and_stays_finite() -> None:
    trainer = make_trainer("optimizations.amp=true", "optimizations.amp_dtype=bfloat16")
    try:
        assert not trainer.learner.scaler.is_enabled()  # bf16 needs no loss scaling
        with MatmulDtypes() as seen:
            trainer.iterate()
        params = snapshot(trainer.model)
        stats = dict(trainer.last_stats)
    finally:
        trainer.close()
    # hidden layers in bf16 while acting and in the update; the output layers stay float32
    assert torch.bfloat16 in seen.dtypes_where(grad_enabled=True)
    assert torch.bfloat16 in seen.dtypes_where(grad_enabled=False)
    assert all(p.dtype == torch.float32 for p in params.values())  # master weights stay float32
    assert all_finite(params, stats)


def test_amp_off_runs_the_forward_in_float32() -> None:
    trainer = make_trainer("optimizations.amp=false")
    seen: list[torch.dtype] = []
    handle = trainer.model.actor.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    try:
        trainer.iterate()
    finally:
        handle.remove()
        trainer.close()
    assert seen and set(seen) == {torch.float32}
    assert not trainer.learner.scaler.is_enabled()


def test_amp_float16_on_cpu_uses_an_enabled_grad_scaler_and_stays_finite() -> None:
    trainer = make_trainer("optimizations.amp=true", "optimizations.amp_dtype=float16")
    try:
        assert trainer.learner.scaler.is_enabled()
        with MatmulDtypes() as seen:
            trainer.iterate()
        params, stats = snapshot(trainer.model), dict(trainer.last_stats)
    finally:
        trainer.close()
    assert torch.float16 in seen.dtypes and torch.bfloat16 not in seen.dtypes
    assert all_finite(params, stats)


def test_amp_bfloat16_params_stay_near_float32_after_one_update() -> None:
    plain, plain_stats = train_once()
    amp, amp_stats = train_once("optimizations.amp=true", "optimizations.amp_dtype=bfloat16")
    assert all_finite(amp, amp_stats)
    # reduced-precision class: one update moves parameters by ~lr, so they stay within a few lr
    for name in plain:
        assert (amp[name] - plain[name]).abs().max() <= 4 * 2.5e-4, name
    assert not all(torch.equal(amp[k], plain[k]) for k in plain)  # bf16 really changed the numbers


# --------------------------------------------------------------------------- torch.compile

@pytest.mark.parametrize("where", ["at-call", "at-compile"])
def test_compile_train_step_failure_falls_back_to_eager_once(monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture, where: str) -> None:
    compiled: list[str] = []

    def broken_compile(fn: Any, **kwargs: Any) -> Any:
        compiled.append(getattr(fn, "__name__", repr(fn)))
        if where == "at-compile":
            raise RuntimeError("planted compile failure")

        def fails(*args: Any, **kw: Any) -> Any:
            raise RuntimeError("planted compiled-call failure")

        return fails

    plain, _ = train_once(iterations=2)
    monkeypatch.setattr(torch, "compile", broken_compile)
    caplog.set_level(logging.WARNING, logger="rlgauge")
    trainer = make_trainer("optimizations.compile_train_step=true")
    try:
        assert compiled == ["_loss_and_grads"]
        assert trainer.compile_fallback is (where == "at-compile")
        trainer.iterate()
        trainer.iterate()
        assert trainer.compile_fallback is True
        assert "RuntimeError" in trainer.learner.loss_and_grads.reason
        params = snapshot(trainer.model)
    finally:
        trainer.close()
    assert len(rlgauge_warnings(caplog, "torch.compile of train_step failed")) == 1
    assert_params_equal(params, plain)


@pytest.mark.slow  # ~4 s with a warm inductor cache, ~30 s cold on 2 cores
def test_compile_model_really_compiles_and_stays_finite() -> None:
    plain, _ = train_once("optimizations.batch_inference=true")
    trainer = make_trainer("optimizations.compile_model=true", "optimizations.batch_inference=true")
    try:
        trainer.iterate()
        params, stats = snapshot(trainer.model), dict(trainer.last_stats)
        fell_back, reason = trainer.compile_fallback, trainer.forward.reason
    finally:
        trainer.close()
    assert all_finite(params, stats)
    assert not fell_back, f"torch.compile fell back to eager: {reason}"
    # fp-reorder class (sampling happens outside the compiled model, so streams match)
    assert_params_close(params, plain, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- stability: nan_policy, clipping

@pytest.fixture
def nan_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every PPO loss NaN (the real loss times NaN, so gradients are NaN too)."""
    real = ppo_mod.ppo_loss

    def poisoned(*args: Any, **kwargs: Any) -> Any:
        loss, stats = real(*args, **kwargs)
        return loss * float("nan"), stats

    monkeypatch.setattr(ppo_mod, "ppo_loss", poisoned)


def test_nan_policy_raise_raises_nonfinite_error(nan_loss: None) -> None:
    trainer = make_trainer("stability.nan_policy=raise")
    try:
        with pytest.raises(NonFiniteError, match="nan_policy=raise"):
            trainer.iterate()
        assert trainer.nonfinite_events == 2
    finally:
        trainer.close()


def test_nan_policy_raise_catches_a_nan_parameter() -> None:
    trainer = make_trainer("stability.nan_policy=raise")
    try:
        with torch.no_grad():
            trainer.model.critic[-1].bias.fill_(float("nan"))  # values -> advantages -> loss are NaN
        with pytest.raises(NonFiniteError):
            trainer.iterate()
    finally:
        trainer.close()


def test_nan_policy_skip_update_keeps_parameters_and_counts_events(nan_loss: None,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rlgauge")
    trainer = make_trainer("stability.nan_policy=skip_update")
    try:
        before = snapshot(trainer.model)
        result = trainer.iterate()
        after = snapshot(trainer.model)
    finally:
        trainer.close()
    assert_params_equal(after, before)
    assert trainer.nonfinite_events == result.updates == 2
    assert not trainer.learner.optimizer.state  # no optimiser step was ever taken
    assert len(rlgauge_warnings(caplog, "skip_update")) == 2


def test_nan_policy_warn_counts_events_and_logs(nan_loss: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rlgauge")
    trainer = make_trainer("stability.nan_policy=warn")
    try:
        result = trainer.iterate()
    finally:
        trainer.close()
    assert trainer.nonfinite_events == result.updates == 2
    assert len(rlgauge_warnings(caplog, "nan_policy=warn")) == 1
    assert "nonfinite" not in trainer.last_stats


@pytest.mark.parametrize("policy", ["raise", "skip_update", "warn"])
def test_finite_training_counts_no_nonfinite_events(policy: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rlgauge")
    trainer = make_trainer(f"stability.nan_policy={policy}")
    try:
        trainer.iterate()
    finally:
        trainer.close()
    assert trainer.nonfinite_events == 0
    assert not [r for r in caplog.records if r.name == "rlgauge"]


def grad_norms_seen(trainer: PPOTrainer) -> list[tuple[float, float]]:
    """Spy on the train step: (norm it returns, norm of the gradients it leaves behind) per minibatch."""
    seen: list[tuple[float, float]] = []
    inner = trainer.learner.loss_and_grads

    def spy(*batch: torch.Tensor) -> Any:
        loss, stats, grad_norm = inner(*batch)
        grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
        seen.append((float(grad_norm), float(torch.nn.utils.get_total_norm(grads))))
        return loss, stats, grad_norm

    trainer.learner.loss_and_grads = spy
    return seen


def test_max_grad_norm_clips_the_gradient_norm() -> None:
    max_norm = 0.01
    trainer = make_trainer(f"stability.max_grad_norm={max_norm}")
    seen = grad_norms_seen(trainer)
    try:
        trainer.iterate()
    finally:
        trainer.close()
    assert len(seen) == 2
    for before, after in seen:
        assert before > max_norm  # clipping had something to do
        assert after <= max_norm * (1 + 1e-5)


def test_max_grad_norm_null_leaves_gradients_unclipped() -> None:
    trainer = make_trainer("stability.max_grad_norm=null")
    seen = grad_norms_seen(trainer)
    try:
        trainer.iterate()
    finally:
        trainer.close()
    assert len(seen) == 2
    for before, after in seen:
        assert before > 0.01
        assert math.isclose(after, before, rel_tol=1e-5)


# --------------------------------------------------------------------------- float32 only

@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("variant", [[], ["optimizations.batch_inference=true", "optimizations.sync_free_logging=true",
                                          "optimizations.optimizer_impl=foreach"]], ids=["plain", "optimised"])
def test_training_state_is_float32_only(env_id: str, variant: list[str]) -> None:
    trainer = make_trainer(f"env.id={env_id}", *variant)
    try:
        wide = WideDtypeOps()
        with wide:
            trainer.iterate()
        assert wide.ops == [], f"float64 ops on the training path: {Counter(wide.ops)}"
        for name, p in trainer.model.named_parameters():
            assert p.dtype == torch.float32, name
            assert p.grad is None or p.grad.dtype == torch.float32, name
        for name, b in trainer.model.named_buffers():
            assert b.dtype == torch.float32, name
        for state in trainer.learner.optimizer.state.values():
            for key, value in state.items():
                if torch.is_tensor(value):
                    assert value.dtype == torch.float32, key
        storage = {"obs_buf": trainer.obs_buf, "logprobs_buf": trainer.logprobs_buf, "values_buf": trainer.values_buf,
                   "rewards_buf": trainer.rewards_buf, "terminated_buf": trainer.terminated_buf,
                   "truncated_buf": trainer.truncated_buf, "valid_buf": trainer.valid_buf}
        for name, tensor in storage.items():
            assert tensor.dtype == torch.float32, name
        assert trainer.actions_buf.dtype == (torch.int64 if trainer.discrete else torch.float32)
        for name, tensor in {**storage, "actions_buf": trainer.actions_buf}.items():
            assert not tensor.requires_grad, f"{name} is attached to an autograd graph"
        assert trainer.last_stats and all(type(v) is float for v in trainer.last_stats.values())
    finally:
        trainer.close()


# --------------------------------------------------------------------------- other envs

def test_pendulum_continuous_actions_are_clipped_before_the_env() -> None:
    trainer = make_trainer("env.id=Pendulum-v1")
    try:
        assert not trainer.discrete
        names = dict(trainer.model.named_parameters())
        assert "log_std" in names and names["log_std"].shape == (1,)
        with torch.no_grad():
            trainer.model.log_std.fill_(math.log(10.0))  # wide policy: many samples fall outside [-2, 2]
        sent: list[np.ndarray] = []
        real_step = trainer.envs.step

        def spy(actions: np.ndarray) -> Any:
            sent.append(np.array(actions, copy=True))
            return real_step(actions)

        trainer.envs.step = spy
        before = snapshot(trainer.model)
        trainer.iterate()
        after = snapshot(trainer.model)
        raw = trainer.actions_buf.cpu().numpy()
        low, high = trainer.envs.single_action_space.low, trainer.envs.single_action_space.high
    finally:
        trainer.close()
    sent_arr = np.stack(sent)
    assert sent_arr.shape == raw.shape == (16, 2, 1)
    assert (np.abs(raw) > 2.0).any()  # clipping had work to do
    assert (sent_arr >= low).all() and (sent_arr <= high).all()
    np.testing.assert_array_equal(sent_arr, np.clip(raw, low, high))
    assert not torch.equal(before["log_std"], after["log_std"])  # log_std is trained
    assert all(bool(torch.isfinite(p).all()) for p in after.values())


def test_acrobot_trains_with_three_discrete_actions() -> None:
    trainer = make_trainer("env.id=Acrobot-v1")
    try:
        assert trainer.discrete and trainer.obs_dim == 6
        trainer.iterate()
        actions = trainer.actions_buf
        assert set(actions.unique().tolist()) <= {0, 1, 2}
        assert trainer.model.actor[-1].out_features == 3
        assert all(math.isfinite(v) for v in trainer.last_stats.values())
    finally:
        trainer.close()


# --------------------------------------------------------------------------- torch_threads

def test_torch_threads_applies_during_iterate_and_none_restores_default() -> None:
    wanted = 1 if dev.DEFAULT_THREADS != 1 else 2
    original = torch.get_num_threads()
    seen: dict[str, int] = {}
    try:
        set_trainer = make_trainer(f"optimizations.torch_threads={wanted}")
        default_trainer = make_trainer("optimizations.torch_threads=null")
        for key, trainer in (("set", set_trainer), ("default", default_trainer), ("set-again", set_trainer)):
            real_collect = trainer.collect

            def spy(_real: Any = real_collect, _key: str = key) -> Any:
                seen[_key] = torch.get_num_threads()
                return _real()

            trainer.collect = spy
            trainer.iterate()
            trainer.collect = real_collect
        set_trainer.close()
        default_trainer.close()
    finally:
        torch.set_num_threads(original)
    assert seen == {"set": wanted, "default": dev.DEFAULT_THREADS, "set-again": wanted}


# --------------------------------------------------------------------------- select_actions

@pytest.mark.parametrize("batch", [False, True])
def test_select_actions_returns_one_valid_action_per_env(batch: bool) -> None:
    trainer = make_trainer("env.num_envs=4", f"optimizations.batch_inference={str(batch).lower()}")
    try:
        actions = trainer.select_actions(trainer.next_obs)
        space = trainer.envs.single_action_space
    finally:
        trainer.close()
    assert isinstance(actions, np.ndarray) and actions.shape == (4,)
    assert all(space.contains(a) for a in actions)


def test_select_actions_returns_in_bounds_actions_for_continuous_envs() -> None:
    trainer = make_trainer("env.id=Pendulum-v1", "env.num_envs=4", "optimizations.batch_inference=true")
    try:
        with torch.no_grad():
            trainer.model.log_std.fill_(math.log(10.0))  # wide policy: samples fall outside [-2, 2]
        actions = trainer.select_actions(trainer.next_obs)
        space = trainer.envs.single_action_space
    finally:
        trainer.close()
    assert actions.shape == (4, 1)
    assert all(space.contains(a) for a in actions)


# --------------------------------------------------------------------------- CUDA / MPS

@needs_cuda
def test_pinned_memory_non_blocking_match_plain_copies_on_cuda() -> None:
    plain, _ = train_once("device=cuda", "optimizations.batch_inference=true", iterations=2)
    fast, stats = train_once("device=cuda", "optimizations.batch_inference=true", "optimizations.pinned_memory=true",
                             "optimizations.non_blocking=true", iterations=2)
    assert_params_close(fast, plain, rtol=1e-6, atol=1e-6)
    assert all_finite(fast, stats)


@needs_cuda
def test_cuda_graphs_match_eager() -> None:
    eager, _ = train_once("device=cuda", "optimizations.batch_inference=true")
    trainer = make_trainer("device=cuda", "optimizations.batch_inference=true", "optimizations.cuda_graphs=true")
    try:
        trainer.iterate()
        graphed = {k: v.cpu() for k, v in snapshot(trainer.model).items()}
        assert trainer.learner.graphed is not None and trainer.learner.graphed.eager_calls == 0
        stats = dict(trainer.last_stats)
    finally:
        trainer.close()
    assert_params_close(graphed, eager, rtol=1e-5, atol=1e-5)
    assert all_finite(graphed, stats)


@needs_cuda
def test_amp_float16_on_cuda_stays_finite() -> None:
    trainer = make_trainer("device=cuda", "optimizations.amp=true", "optimizations.amp_dtype=float16",
                           "optimizations.batch_inference=true")
    try:
        assert trainer.learner.scaler.is_enabled()
        trainer.iterate()
        params, stats = snapshot(trainer.model), dict(trainer.last_stats)
    finally:
        trainer.close()
    assert all_finite(params, stats)
    assert all(p.dtype == torch.float32 for p in params.values())


@needs_mps
@pytest.mark.parametrize("variant", [[], ["optimizations.batch_inference=true", "optimizations.sync_free_logging=true"]],
                         ids=["plain", "optimised"])
def test_mps_smoke_runs_finite(variant: list[str]) -> None:
    params, stats = train_once("device=mps", *variant)
    assert all_finite(params, stats)


# --------------------------------------------------------------------------- learning (slow)

@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("variant", ["baseline", "optimized"])
def test_ppo_cartpole_learns_both_variants(variant: str, seed: int) -> None:
    from harness.specs.presets import load_preset

    data = load_preset("ppo-cartpole").variant_data(variant)
    trainer = PPOTrainer(build_config(data, ["device=cpu", f"seed={seed}"]))
    best = -math.inf
    original_threads = torch.get_num_threads()
    try:
        while trainer.env_steps < 150_000 and best < 195.0:
            trainer.iterate()
            mean = trainer.mean_recent_return()
            if trainer.tracker.completed >= 20 and mean is not None:
                best = max(best, mean)
    finally:
        trainer.close()
        torch.set_num_threads(original_threads)
    assert best >= 195.0, f"{variant} seed {seed}: best mean return of the last 20 episodes {best} after {trainer.env_steps} env steps"


@pytest.mark.parametrize("lean", ["false", "true"])
def test_env_steps_count_transitions_not_reset_steps(lean: str) -> None:
    """A NEXT_STEP reset step takes no transition: the frames an iteration reports are the rollout's valid rows."""
    trainer = make_trainer(f"optimizations.lean_rollout={lean}", "ppo.num_steps=64")
    try:
        result = trainer.iterate()
        assert trainer.valid_buf.min() == 0, "the rollout should hold reset steps"
        assert result.env_steps == int(trainer.valid_buf.sum()) < result.agent_steps == 64 * trainer.num_envs
        assert trainer.env_steps == result.env_steps
    finally:
        trainer.close()
