"""Train a tiny configuration for K updates under the sentinels; compare with the all-plain reference."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from harness.parity import REDUCED_PRECISION, TOLERANCES
from harness.sentinels import Float64Sentinel
from reference_trainers import build_trainer
from reference_trainers.common import device as dev
from reference_trainers.common.config import build_config
from reference_trainers.common.resolve import resolve_config
from strategies import PIXEL_OVERRIDES, PROPERTY_NUM_ENVS

_COMMON = ["env.id=CartPole-v1", f"env.num_envs={PROPERTY_NUM_ENVS}", "env.vectorization=serial",
           "model.hidden_sizes=[16,16]"]
_VALUE = ["buffer_size=64", "batch_size=8", "learning_starts=12", "train_frequency=1", "gradient_steps=1",
          "target_update_interval=2", "exploration_steps=30", "log_interval=24"]
TINY: dict[str, list[str]] = {
    "ppo": ["algo=ppo", *_COMMON, "ppo.num_steps=8", "ppo.num_minibatches=2", "ppo.update_epochs=1"],
    "dqn": ["algo=dqn", *_COMMON, *(f"dqn.{kv}" for kv in _VALUE)],
    "iqn": ["algo=iqn", *_COMMON, *(f"iqn.{kv}" for kv in _VALUE), "iqn.num_tau_samples=8",
            "iqn.num_tau_prime_samples=8", "iqn.num_quantile_samples=4", "iqn.quantile_embedding_dim=16"],
    "ppo-lstm": ["algo=ppo", *_COMMON, "model.recurrent=lstm", "model.recurrent_size=8", "ppo.num_steps=8",
                 f"ppo.num_minibatches={PROPERTY_NUM_ENVS}", "ppo.update_epochs=1"],
}
"""Per algorithm (``ppo-lstm``: recurrent PPO), a configuration that makes a few optimiser
updates per ``iterate()``."""
ALGOS = tuple(TINY)
PIXEL_ALGOS = ("ppo", "dqn", "iqn")
"""The algorithms with a CNN body (recurrent PPO runs on the MLP body only)."""
ITERATIONS = 2
"""Exact and fp-reorder classes compare after 2 iterations (PPO: 2 x 2 minibatch updates;
DQN/IQN: 24 agent steps each, updates from the 12th on)."""
ONE_UPDATE: dict[str, list[str]] = {
    "ppo": ["ppo.num_minibatches=1"],
    "dqn": ["dqn.learning_starts=22", "dqn.log_interval=24"],
    "iqn": ["iqn.learning_starts=22", "iqn.log_interval=24"],
    "ppo-lstm": ["ppo.num_minibatches=1"],
}
"""Reduced precision compares after exactly one optimiser update (one iteration)."""


@dataclass
class Outcome:
    params: dict[str, torch.Tensor]
    stats: dict[str, float]
    float64_ops: int
    float64_site: str | None
    nonfinite_events: int
    dtypes: set[torch.dtype]
    compile_fallback: bool


def train(overrides: list[str], *, seed: int, device: str = "cpu", iterations: int = ITERATIONS,
          watch_float64: bool = True, algo: str = "ppo", pixels: bool = False) -> Outcome:
    """Build and run a trainer (under the float64 sentinel unless told otherwise: a dispatch
    mode makes ``torch.compile`` run eagerly, so compiled numerics are checked without it).
    ``pixels``: on the tiny image env with the Nature CNN."""
    scene = PIXEL_OVERRIDES if pixels else []
    config = build_config({}, TINY[algo] + scene + overrides + [f"seed={seed}", f"device={device}"])
    saved = dev.process_settings()
    sentinel = Float64Sentinel()
    trainer = None
    try:
        with sentinel if watch_float64 else contextlib.nullcontext():
            trainer = build_trainer(resolve_config(config))
            for _ in range(iterations):
                trainer.iterate()
        params = {n: p.detach().to("cpu", copy=True) for n, p in trainer.model.named_parameters()}
        dtypes = {p.dtype for p in trainer.model.parameters()}
        dtypes |= {t.dtype for t in vars(trainer).values() if isinstance(t, torch.Tensor)}
        return Outcome(params, dict(trainer.last_stats), sentinel.count, sentinel.first_site,
                       trainer.nonfinite_events, dtypes, trainer.compile_fallback)
    finally:
        if trainer is not None:
            trainer.close()
        dev.restore_process_settings(saved)


@functools.lru_cache(maxsize=64)
def reference(seed: int, device: str = "cpu", one_update: bool = False, algo: str = "ppo",
              pixels: bool = False) -> Outcome:
    """The all-plain run for a seed (cached: hypothesis reuses seeds)."""
    return train(ONE_UPDATE[algo] if one_update else [], seed=seed, device=device,
                 iterations=1 if one_update else ITERATIONS, algo=algo, pixels=pixels)


def assert_parity(candidate: Outcome, ref: Outcome, parity_class: str) -> None:
    """Parameters and losses agree with the reference within the class's tolerance."""
    tol = TOLERANCES[parity_class]
    assert candidate.params.keys() == ref.params.keys()
    for name, value in candidate.params.items():
        torch.testing.assert_close(value, ref.params[name], rtol=tol.rtol, atol=tol.atol,
                                   msg=lambda m, name=name: f"{parity_class} parity broken for {name}: {m}")
    # Losses are means of terms of order one that largely cancel (normalised advantages sum
    # to zero), so their round-off is relative to the terms' scale, not to the mean.
    keys = tuple(k for k in ("value_loss", "entropy", "loss") if k in ref.stats) if parity_class == REDUCED_PRECISION \
        else tuple(ref.stats)
    for key in keys:
        got, want = candidate.stats[key], ref.stats[key]
        assert abs(got - want) <= tol.rtol * max(abs(want), 1.0) + tol.atol, f"{parity_class}: {key} {got} vs {want}"


def assert_clean(outcome: Outcome) -> None:
    """Every combination: no float64 op, finite parameters, float32 state (uint8 frames), Python-float stats."""
    assert outcome.float64_ops == 0, f"float64 op on the training path: {outcome.float64_site}"
    assert outcome.nonfinite_events == 0
    for name, value in outcome.params.items():
        assert torch.isfinite(value).all(), f"non-finite parameter {name}"
    assert outcome.dtypes <= {torch.float32, torch.int64, torch.uint8}, outcome.dtypes
    assert all(type(v) is float for v in outcome.stats.values()), outcome.stats
