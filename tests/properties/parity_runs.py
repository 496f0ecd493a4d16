"""Train a tiny configuration for K updates under the sentinels; compare with the all-plain reference."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from harness.stats.parity import REDUCED_PRECISION, TOLERANCES, UpdateAgreement, reduced_precision_agreement
from harness.measurement.sentinels import Float64Sentinel
from reference_trainers import build_trainer
from reference_trainers.runtime import device as dev
from reference_trainers.config.schema import build_config
from reference_trainers.paths.learner import Learner
from reference_trainers.config.resolve import resolve_config
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
"""The exact, fp-reorder and reduced-precision classes compare after 2 iterations (PPO: 2 x 2
minibatch updates; DQN/IQN: 24 agent steps each, updates from the 12th on)."""
SEVERAL_UPDATES: dict[str, list[str]] = {
    "ppo": ["ppo.num_minibatches=1", "ppo.update_epochs=4"],
    "dqn": [],
    "iqn": [],
    "ppo-lstm": [],
}
"""Reduced precision compares these configurations after ``ITERATIONS`` iterations: PPO makes four
full-batch epochs per rollout (8 updates, each batch's gradient followed several times), so that
an update fp16's GradScaler skips while it calibrates changes little; DQN/IQN (13 updates) and
recurrent PPO (6) run as the other classes do, and share their references."""
LOSSES = ("loss", "policy_loss", "value_loss", "entropy")
"""The per-update statistics the reduced-precision class compares (those an algorithm records)."""


@dataclass
class Outcome:
    params: dict[str, torch.Tensor]
    stats: dict[str, float]
    float64_ops: int
    float64_site: str | None
    nonfinite_events: int
    dtypes: set[torch.dtype]
    compile_fallback: bool
    initial: dict[str, torch.Tensor]
    """The parameters as built, before the first update."""
    trajectory: dict[str, list[float]]
    """Each scalar statistic (losses, entropy, ...) of every optimiser update, in order."""


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
            initial = _snapshot(trainer.model)
            trajectory = _record_updates(trainer.learner)
            for _ in range(iterations):
                trainer.iterate()
        params = _snapshot(trainer.model)
        dtypes = {p.dtype for p in trainer.model.parameters()}
        dtypes |= {t.dtype for t in vars(trainer).values() if isinstance(t, torch.Tensor)}
        return Outcome(params, dict(trainer.last_stats), sentinel.count, sentinel.first_site,
                       trainer.nonfinite_events, dtypes, trainer.compile_fallback, initial, trajectory)
    finally:
        if trainer is not None:
            trainer.close()
        dev.restore_process_settings(saved)


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}


def _record_updates(learner: Learner) -> dict[str, list[float]]:
    """Wrap this learner's ``step`` so that each update's 0-d statistics are appended to the
    returned series (read at once: a CUDA graph's outputs are overwritten by the next replay)."""
    series: dict[str, list[float]] = {}
    step = learner.step

    def recorded(*batch: torch.Tensor) -> dict[str, torch.Tensor]:
        stats = step(*batch)
        for name, value in stats.items():
            if value.ndim == 0:
                series.setdefault(name, []).append(float(value))
        return stats

    learner.step = recorded  # type: ignore[method-assign]
    return series


def reference(seed: int, device: str = "cpu", several_updates: bool = False, algo: str = "ppo",
              pixels: bool = False) -> Outcome:
    """The all-plain run for a seed (cached: hypothesis reuses seeds); ``several_updates``: of the
    reduced-precision configuration (``SEVERAL_UPDATES``)."""
    return _reference(seed, device, tuple(SEVERAL_UPDATES[algo]) if several_updates else (), algo, pixels)


@functools.lru_cache(maxsize=64)
def _reference(seed: int, device: str, overrides: tuple[str, ...], algo: str, pixels: bool) -> Outcome:
    return train(list(overrides), seed=seed, device=device, algo=algo, pixels=pixels)


def assert_parity(candidate: Outcome, ref: Outcome, parity_class: str) -> None:
    """Parameters and losses agree with the reference within the class's tolerance (reduced
    precision: ``assert_tracks_float32``)."""
    if parity_class == REDUCED_PRECISION:
        assert_tracks_float32(candidate, ref)
        return
    tol = TOLERANCES[parity_class]
    assert candidate.params.keys() == ref.params.keys()
    for name, value in candidate.params.items():
        torch.testing.assert_close(value, ref.params[name], rtol=tol.rtol, atol=tol.atol,
                                   msg=lambda m, name=name: f"{parity_class} parity broken for {name}: {m}")
    for key, want in ref.stats.items():
        got = candidate.stats[key]
        assert abs(got - want) <= tol.rtol * max(abs(want), 1.0) + tol.atol, f"{parity_class}: {key} {got} vs {want}"


def tracking(candidate: Outcome, ref: Outcome) -> UpdateAgreement:
    """The candidate's parameter change and loss trajectory against the reference's (same seed)."""
    def losses(outcome: Outcome) -> dict[str, list[float]]:
        return {k: v for k, v in outcome.trajectory.items() if k in LOSSES}

    return reduced_precision_agreement(ref.initial, candidate.params, ref.params, losses(candidate), losses(ref))


def assert_tracks_float32(candidate: Outcome, ref: Outcome) -> None:
    """Reduced precision: from the same initial parameters, over several updates, the parameter
    change points and reaches where float32's does and the losses stay near float32's
    (``harness.stats.parity.REDUCED_PRECISION_BOUNDS``)."""
    for name, value in ref.initial.items():
        assert torch.equal(candidate.initial[name], value), f"not the reference's initial {name}: another seed?"
    agreement = tracking(candidate, ref)
    assert not agreement.failures, f"{REDUCED_PRECISION} parity broken: {'; '.join(agreement.failures)}"


def assert_clean(outcome: Outcome) -> None:
    """Every combination: no float64 op, finite parameters, float32 state (uint8 frames), Python-float stats."""
    assert outcome.float64_ops == 0, f"float64 op on the training path: {outcome.float64_site}"
    assert outcome.nonfinite_events == 0
    for name, value in outcome.params.items():
        assert torch.isfinite(value).all(), f"non-finite parameter {name}"
    assert outcome.dtypes <= {torch.float32, torch.int64, torch.uint8}, outcome.dtypes
    assert all(type(v) is float for v in outcome.stats.values()), outcome.stats
