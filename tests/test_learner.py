"""The shared update machinery (reference_trainers/paths/learner.py), on a toy regression: one
optimiser step per ``step``, nan_policy, clipping, compile fallback, learning rate, stats routing,
process-wide settings; and the PPO trainer handing its update to it."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch import nn

from harness.stats.parity import FP_REORDER, TOLERANCES
from precision_state import float32_matmul_precision
from reference_trainers.runtime import device as dev
from reference_trainers.config.schema import build_config
from reference_trainers.paths.learner import (
    Learner,
    NonFiniteError,
    apply_process_settings,
    fell_back,
    maybe_compile,
)
from reference_trainers.config.resolve import resolve_config
from reference_trainers.paths.speedups import CompiledOrEager
from reference_trainers.paths.training_stats import ItemStats, SyncFreeStats

CPU = torch.device("cpu")


class Toy:
    """A linear model and its mean-squared-error closure; ``poison`` makes the loss NaN."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(3, 1)
        self.x, self.y = torch.randn(16, 3), torch.randn(16, 1)
        self.poison = False

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        error = self.model(x) - y
        loss = error.pow(2).mean() * (float("nan") if self.poison else 1.0)
        return loss, {"mse": loss.detach(), "per_sample": error.detach().abs().squeeze(1)}


def make_learner(*overrides: str, lr: float = 0.1) -> tuple[Learner, Toy]:
    toy = Toy()
    config = resolve_config(build_config({}, ["device=cpu", *overrides])).config
    return Learner(toy.model, toy.loss, config, CPU, learning_rate=lr, adam_eps=1e-8), toy


def params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_step_takes_one_optimiser_step_and_lowers_the_loss() -> None:
    learner, toy = make_learner()
    before = toy.loss(toy.x, toy.y)[0].item()
    for _ in range(20):
        learner.step(toy.x, toy.y)
    assert toy.loss(toy.x, toy.y)[0].item() < before
    assert learner.optimizer.state[toy.model.weight]["step"] == 20


def test_step_logs_scalar_stats_and_hands_back_per_sample_ones() -> None:
    learner, toy = make_learner()
    stats = learner.step(toy.x, toy.y)
    assert stats["per_sample"].shape == (16,)
    means = learner.flush(updates=1, iteration=1)
    assert set(means) == {"mse"} and type(means["mse"]) is float


@pytest.mark.parametrize(("flag", "cls"), [("false", ItemStats), ("true", SyncFreeStats)])
def test_sync_free_logging_picks_the_stats_class(flag: str, cls: type) -> None:
    learner, _ = make_learner(f"optimizations.sync_free_logging={flag}")
    assert type(learner.stats) is cls


def test_nan_policy_skip_update_keeps_parameters_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rlgauge")
    learner, toy = make_learner("stability.nan_policy=skip_update")
    toy.poison = True
    before = params(toy.model)
    learner.step(toy.x, toy.y)
    learner.step(toy.x, toy.y)
    assert all(torch.equal(a, b) for a, b in zip(before, params(toy.model)))
    assert learner.nonfinite_events == 2 and not learner.optimizer.state
    assert sum("skip_update" in r.getMessage() for r in caplog.records) == 2


def test_nan_policy_raise_raises_at_flush_with_the_count() -> None:
    learner, toy = make_learner("stability.nan_policy=raise")
    toy.poison = True
    learner.step(toy.x, toy.y)
    learner.step(toy.x, toy.y)
    with pytest.raises(NonFiniteError, match="2 update\\(s\\).*iteration 7.*nan_policy=raise"):
        learner.flush(updates=2, iteration=7)
    assert learner.nonfinite_events == 2


def test_nan_policy_warn_counts_and_warns_once_per_flush(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rlgauge")
    learner, toy = make_learner("stability.nan_policy=warn")
    toy.poison = True
    for _ in range(3):
        learner.step(toy.x, toy.y)
    means = learner.flush(updates=3, iteration=1)
    assert learner.nonfinite_events == 3 and "nonfinite" not in means
    assert sum("nan_policy=warn" in r.getMessage() for r in caplog.records) == 1


def test_finite_updates_count_no_events() -> None:
    learner, toy = make_learner("stability.nan_policy=raise")
    learner.step(toy.x, toy.y)
    learner.flush(updates=1, iteration=1)
    assert learner.nonfinite_events == 0


@pytest.mark.parametrize("max_norm", ["0.01", "null"])
def test_max_grad_norm_clips_or_reports_the_total_norm(max_norm: str) -> None:
    learner, toy = make_learner(f"stability.max_grad_norm={max_norm}")
    toy.y = toy.y * 100  # large gradients
    _, _, grad_norm = learner.loss_and_grads(toy.x, toy.y)
    after = torch.nn.utils.get_total_norm([p.grad for p in toy.model.parameters()])
    assert grad_norm > 0.01
    if max_norm == "null":
        torch.testing.assert_close(after, grad_norm)
    else:
        assert after <= 0.01 * (1 + 1e-5)


def test_set_learning_rate_sets_a_float_or_fills_a_tensor() -> None:
    learner, _ = make_learner()
    learner.set_learning_rate(0.25)
    assert learner.optimizer.param_groups[0]["lr"] == 0.25
    lr = torch.tensor(0.1)
    learner.optimizer.param_groups[0]["lr"] = lr
    learner.set_learning_rate(0.5)
    assert learner.optimizer.param_groups[0]["lr"] is lr and lr.item() == 0.5  # in place: graphs see it


@pytest.mark.parametrize(("impl", "foreach", "fused"), [("forloop", False, False), ("foreach", True, None),
                                                        ("fused", None, True)])
def test_optimizer_impl_selects_the_adam_implementation(impl: str, foreach: bool | None, fused: bool | None) -> None:
    learner, _ = make_learner(f"optimizations.optimizer_impl={impl}")
    assert learner.optimizer.defaults["foreach"] is foreach
    assert bool(learner.optimizer.defaults["fused"]) is bool(fused)


def test_compile_train_step_wraps_the_closure_and_falls_back_once(monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    compiled: list[str] = []

    def broken(fn: Any, **kwargs: Any) -> Any:
        compiled.append(fn.__name__)
        assert kwargs == {"dynamic": True}

        def fails(*args: Any) -> Any:
            raise RuntimeError("planted")

        return fails

    monkeypatch.setattr(torch, "compile", broken)
    caplog.set_level(logging.WARNING, logger="rlgauge")
    learner, toy = make_learner("optimizations.compile_train_step=true")
    assert compiled == ["_loss_and_grads"] and isinstance(learner.loss_and_grads, CompiledOrEager)
    plain, plain_toy = make_learner()
    for _ in range(3):
        learner.step(toy.x, toy.y)
        plain.step(plain_toy.x, plain_toy.y)
    assert fell_back(learner.loss_and_grads) and not fell_back(plain.loss_and_grads)
    assert all(torch.equal(a, b) for a, b in zip(params(toy.model), params(plain_toy.model)))
    assert sum("torch.compile of train_step failed" in r.getMessage() for r in caplog.records) == 1


def test_maybe_compile_returns_the_model_unless_compile_model(monkeypatch: pytest.MonkeyPatch) -> None:
    model = nn.Linear(2, 2)
    plain = resolve_config(build_config({}, ["device=cpu"])).config.optimizations
    assert maybe_compile(model, plain) is model
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    on = resolve_config(build_config({}, ["device=cpu", "optimizations.compile_model=true",
                                          "optimizations.compile_mode=reduce-overhead"])).config.optimizations
    wrapped = maybe_compile(model, on, "target_model")
    assert isinstance(wrapped, CompiledOrEager) and wrapped.name == "target_model" and wrapped.eager is model


def test_amp_float16_enables_the_grad_scaler_and_bf16_does_not() -> None:
    fp16, _ = make_learner("optimizations.amp=true", "optimizations.amp_dtype=float16")
    bf16, _ = make_learner("optimizations.amp=true", "optimizations.amp_dtype=bfloat16")
    off, _ = make_learner()
    assert fp16.scaler.is_enabled() and not bf16.scaler.is_enabled() and not off.scaler.is_enabled()
    with bf16.autocast():
        assert nn.Linear(2, 2)(torch.ones(1, 2)).dtype == torch.bfloat16
    with off.autocast():
        assert nn.Linear(2, 2)(torch.ones(1, 2)).dtype == torch.float32


def test_apply_process_settings_sets_threads_and_precision() -> None:
    saved = dev.process_settings()
    try:
        wanted = 1 if dev.DEFAULT_THREADS != 1 else 2
        config = build_config({}, [f"optimizations.torch_threads={wanted}", "optimizations.matmul_precision=medium"])
        apply_process_settings(config.optimizations)
        assert torch.get_num_threads() == wanted and float32_matmul_precision() == "medium"
        apply_process_settings(build_config({}, []).optimizations)
        assert torch.get_num_threads() == dev.DEFAULT_THREADS and float32_matmul_precision() == "highest"
    finally:
        dev.restore_process_settings(saved)


def test_ppo_trainer_hands_its_update_to_the_shared_learner() -> None:
    from reference_trainers.ppo.trainer import PPOTrainer

    trainer = PPOTrainer(build_config({}, ["device=cpu", "env.num_envs=2", "ppo.num_steps=8", "ppo.num_minibatches=2",
                                           "ppo.update_epochs=1", "model.hidden_sizes=[8]"]))
    try:
        learner = trainer.learner
        assert learner.model is trainer.model
        seen: list[int] = []
        inner = learner.loss_and_grads
        learner.loss_and_grads = lambda *batch: (seen.append(len(batch)), inner(*batch))[1]
        result = trainer.iterate()
        assert seen == [7] * result.updates  # obs, actions, logprobs, advantages, returns, values, mask
    finally:
        trainer.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphed_step_matches_eager_steps() -> None:
    cuda = torch.device("cuda")
    results = []
    for graphs in ("false", "true"):
        toy = Toy()
        toy.model.to(cuda)
        x, y = toy.x.to(cuda), toy.y.to(cuda)
        config = resolve_config(build_config({}, ["device=cuda", f"optimizations.cuda_graphs={graphs}"])).config
        learner = Learner(toy.model, toy.loss, config, cuda, learning_rate=1e-3, adam_eps=1e-8)
        for _ in range(5):
            learner.step(x, y)
        if graphs == "true":
            assert learner.graphed is not None and learner.graphed.eager_calls == 0
        results.append([p.detach().cpu() for p in toy.model.parameters()])
    tol = TOLERANCES[FP_REORDER]  # capturable Adam keeps its step counts as float32 device tensors
    for eager, graphed in zip(*results):
        torch.testing.assert_close(graphed, eager, rtol=tol.rtol, atol=tol.atol)
