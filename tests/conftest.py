"""Shared fixtures and the hypothesis profiles (``ci`` under CI=true, ``dev`` otherwise)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, max_examples=10,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") == "true" else "dev"))

TINY = [
    "device=cpu", "env.num_envs=2", "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=1",
    "model.hidden_sizes=[16,16]", "run.steps=64", "run.warmup_steps=0", "run.repeats=1", "run.latency_samples=5",
]
"""``--set`` overrides that make any PPO preset run in well under a second."""


@pytest.fixture
def tiny() -> list[str]:
    return list(TINY)
