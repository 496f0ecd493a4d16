"""The parity and stability checks catch planted bugs (planted by monkeypatch, never in product code)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.stats.parity import EXACT, REDUCED_PRECISION
from parity_runs import SEVERAL_UPDATES, assert_clean, assert_parity, reference, train
from reference_trainers.ppo import trainer as ppo
from reference_trainers.paths.acting import BatchedActing
from reference_trainers.paths.learner import Learner, NonFiniteError


def test_float64_sentinel_catches_a_planted_float64_op(monkeypatch: pytest.MonkeyPatch) -> None:
    real_gae = ppo.compute_gae

    def gae_through_float64(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        advantages, returns = real_gae(*args, **kwargs)
        return advantages.double().float(), returns

    monkeypatch.setattr(ppo, "compute_gae", gae_through_float64)
    outcome = train([], seed=0)
    assert outcome.float64_ops > 0
    assert "_to_copy" in (outcome.float64_site or "")
    with pytest.raises(AssertionError, match="float64 op"):
        assert_clean(outcome)


@pytest.mark.parametrize("policy", ["warn", "skip_update"])
def test_nonfinite_checks_catch_a_planted_nan(monkeypatch: pytest.MonkeyPatch, policy: str) -> None:
    real_loss = ppo.ppo_loss

    def nan_loss(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        loss, stats = real_loss(*args, **kwargs)
        return loss * torch.tensor(float("nan")), stats

    monkeypatch.setattr(ppo, "ppo_loss", nan_loss)
    outcome = train([f"stability.nan_policy={policy}"], seed=0, iterations=1)
    assert outcome.nonfinite_events > 0
    with pytest.raises(AssertionError):
        assert_clean(outcome)


def test_nan_policy_raise_stops_training(monkeypatch: pytest.MonkeyPatch) -> None:
    real_loss = ppo.ppo_loss
    monkeypatch.setattr(ppo, "ppo_loss", lambda *a, **k: (lambda l, s: (l * float("nan"), s))(*real_loss(*a, **k)))
    with pytest.raises(NonFiniteError):
        train(["stability.nan_policy=raise"], seed=0, iterations=1)


def test_exact_parity_catches_a_wrong_index_in_the_batched_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batched path that pairs env i's observation with env i+1's action must not pass as exact."""
    real_act = BatchedActing.__call__

    def off_by_one(self, obs):  # noqa: ANN001, ANN202
        step = real_act(self, obs)
        return step._replace(host_actions=np.roll(step.host_actions, 1, axis=0))

    monkeypatch.setattr(BatchedActing, "__call__", off_by_one)
    outcome = train(["optimizations.batch_inference=true"], seed=0)
    assert_clean(outcome)  # nothing non-finite or float64: only parity can see this bug
    with pytest.raises(AssertionError, match="exact parity broken|exact:"):
        assert_parity(outcome, reference(0), EXACT)


def _amp(dtype: str) -> list[str]:
    return ["optimizations.amp=true", f"optimizations.amp_dtype={dtype}"]


def _skip_every_optimiser_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adam's ``step`` does nothing (the plain path calls it directly, fp16 through the GradScaler)."""
    monkeypatch.setattr(torch.optim.Adam, "step", lambda self, closure=None: None)


def _ascend_the_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every gradient negated after backward, unscaling and clipping: each step goes uphill."""
    real = Learner._loss_and_grads

    def uphill(self: Learner, *batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        out = real(self, *batch)
        for p in self.params:
            if p.grad is not None:
                p.grad.neg_()
        return out

    monkeypatch.setattr(Learner, "_loss_and_grads", uphill)


BAD_UPDATES = {"skipped": (_skip_every_optimiser_step, "norm ratio"), "reversed": (_ascend_the_gradient, "cosine")}


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("bug", sorted(BAD_UPDATES))
def test_reduced_precision_parity_catches_a_skipped_or_reversed_update(monkeypatch: pytest.MonkeyPatch, algo: str,
                                                                      dtype: str, bug: str) -> None:
    """Under AMP, an optimiser step that does nothing or goes uphill stays finite and float32, and
    moves parameters by no more than lr-sized steps: only the reduced-precision check can see it."""
    plain = reference(0, several_updates=True, algo=algo)  # before planting: the reference is cached
    plant, symptom = BAD_UPDATES[bug]
    plant(monkeypatch)
    outcome = train(_amp(dtype) + SEVERAL_UPDATES[algo], seed=0, algo=algo)
    assert_clean(outcome)
    with pytest.raises(AssertionError, match=f"{REDUCED_PRECISION} parity broken: .*{symptom}"):
        assert_parity(outcome, plain, REDUCED_PRECISION)


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_parity_passes_honest_amp(algo: str, dtype: str) -> None:
    """The same runs without a planted bug pass (fp16 includes the GradScaler's calibration skips)."""
    outcome = train(_amp(dtype) + SEVERAL_UPDATES[algo], seed=0, algo=algo)
    assert_clean(outcome)
    assert_parity(outcome, reference(0, several_updates=True, algo=algo), REDUCED_PRECISION)


def test_reduced_precision_parity_catches_a_mis_scaled_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp16: a value loss logged with the GradScaler's 2**16 still in it leaves the updates right but
    the loss trajectory far from float32's."""
    plain = reference(0, several_updates=True)
    real_loss = ppo.ppo_loss

    def scaled_stats(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        loss, stats = real_loss(*args, **kwargs)
        return loss, {**stats, "value_loss": stats["value_loss"] * 2.0 ** 16}

    monkeypatch.setattr(ppo, "ppo_loss", scaled_stats)
    outcome = train(_amp("float16") + SEVERAL_UPDATES["ppo"], seed=0)
    assert_clean(outcome)
    with pytest.raises(AssertionError, match=f"{REDUCED_PRECISION} parity broken: value_loss at update 0"):
        assert_parity(outcome, plain, REDUCED_PRECISION)
