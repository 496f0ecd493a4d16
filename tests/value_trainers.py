"""Helpers for the value-based trainer tests (test_value_based.py, test_dqn.py, test_iqn.py)."""

from __future__ import annotations

from typing import Any

import torch

from reference_trainers import build_trainer
from reference_trainers.config.schema import build_config
from reference_trainers.config.resolve import resolve_config
from reference_trainers.value.loop import ValueTrainer

ALGOS = ("dqn", "iqn")


def tiny(algo: str) -> list[str]:
    """``--set`` overrides for a value-based trainer that updates from its second vector step on."""
    base = [f"algo={algo}", "device=cpu", "env.num_envs=2", "env.vectorization=serial", "model.hidden_sizes=[16,16]",
            "run.steps=64", "run.warmup_steps=0", "run.repeats=1", "run.latency_samples=5"]
    section = [f"{algo}.{key}" for key in ("batch_size=8", "buffer_size=256", "learning_starts=16", "log_interval=32",
                                           "train_frequency=1", "gradient_steps=1", "target_update_interval=4",
                                           "exploration_steps=64")]
    if algo == "iqn":
        section += ["iqn.num_tau_samples=8", "iqn.num_tau_prime_samples=6", "iqn.num_quantile_samples=4",
                    "iqn.quantile_embedding_dim=8"]
    return base + section


def make(algo: str, *overrides: str) -> ValueTrainer:
    return build_trainer(resolve_config(build_config({}, tiny(algo) + list(overrides))))


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone().cpu() for name, p in module.named_parameters()}


def train(algo: str, *overrides: str, iterations: int = 2) -> tuple[dict[str, torch.Tensor], dict[str, float], Any]:
    """Parameters and last stats after ``iterations``; asserts that updates happened and moved parameters."""
    trainer = make(algo, *overrides)
    try:
        before = snapshot(trainer.model)
        for _ in range(iterations):
            trainer.iterate()
        after = snapshot(trainer.model)
        assert trainer.updates > 0
        assert any(not torch.equal(before[k], after[k]) for k in before), "training did not change any parameter"
        return after, dict(trainer.last_stats), trainer
    finally:
        trainer.close()


def assert_params_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name}: max abs diff {(a[name] - b[name]).abs().max()}"


def assert_params_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rtol: float, atol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")
