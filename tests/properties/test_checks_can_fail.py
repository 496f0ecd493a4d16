"""The parity and stability checks catch planted bugs (planted by monkeypatch, never in product code)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.parity import EXACT
from parity_runs import assert_clean, assert_parity, reference, train
from reference_trainers import ppo


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
    with pytest.raises(ppo.NonFiniteError):
        train(["stability.nan_policy=raise"], seed=0, iterations=1)


def test_exact_parity_catches_a_wrong_index_in_the_batched_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batched path that pairs env i's observation with env i+1's action must not pass as exact."""
    real_act = ppo.PPOTrainer._act_batched

    def off_by_one(self, obs):  # noqa: ANN001, ANN202
        obs_t, action, logprob, value, host_actions = real_act(self, obs)
        return obs_t, action, logprob, value, np.roll(host_actions, 1, axis=0)

    monkeypatch.setattr(ppo.PPOTrainer, "_act_batched", off_by_one)
    outcome = train(["optimizations.batch_inference=true"], seed=0)
    assert_clean(outcome)  # nothing non-finite or float64: only parity can see this bug
    with pytest.raises(AssertionError, match="exact parity broken|exact:"):
        assert_parity(outcome, reference(0), EXACT)
