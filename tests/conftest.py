"""Shared fixtures and the hypothesis profiles (``ci`` under CI=true, ``dev`` otherwise)."""

from __future__ import annotations

import os
from collections.abc import Iterator

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n: share the cores among the workers before torch picks its thread count. Two workers
    # with torch's default of a thread per core would oversubscribe them, and small ops whose
    # threads spin-wait for each other then run many times slower.
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers)))

import pytest
import torch._dynamo  # noqa: F401 - loaded once per worker: pytester's in-process sessions drop modules
from hypothesis import HealthCheck, settings

from reference_trainers.runtime import device as dev
from reference_trainers.paths.numpy_acting import numpy_blas_threads

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


@pytest.fixture(autouse=True)
def _restore_process_settings() -> Iterator[None]:
    """A run sets process-wide state (torch threads, matmul precision, TF32, NumPy's BLAS threads under
    numpy_acting): keep it out of other tests."""
    saved = dev.process_settings()
    yield
    dev.restore_process_settings(saved)
    numpy_blas_threads.apply(False)


@pytest.fixture(autouse=True)
def _distribution_checks_on() -> Iterator[None]:
    """torch's first compile in a process turns distribution argument checks off for good
    (``Distribution.set_default_validate_args(False)`` in dynamo's set-up): each test starts from torch's
    default, whatever a test before it compiled."""
    import torch

    distribution = torch.distributions.Distribution
    saved = distribution._validate_args
    distribution.set_default_validate_args(True)
    yield
    distribution.set_default_validate_args(saved)


@pytest.fixture(autouse=True)
def _quiet_machine_for_fair_threads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """``run.fair_threads`` samples the cores other processes keep busy; under pytest -n the other
    workers are those processes, and a cap that comes and goes would change thread counts (and
    float reduction order) between two runs a test compares. Tests marked ``machine_load`` see
    the real machine."""
    if request.node.get_closest_marker("machine_load") is None:
        from harness.measurement import machine_state

        monkeypatch.setattr(machine_state, "busy_cores_now", lambda seconds=0.0: 0.0)


@pytest.fixture
def tiny() -> list[str]:
    return list(TINY)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--effects-of", action="append", default=[], metavar="KEY",
                     help="run only the tests marked flag_effect(KEY) (repeatable): the mutation drill's selection")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keys = set(config.getoption("--effects-of"))
    if not keys:
        return
    chosen = [item for item in items if any(m.args and m.args[0] in keys for m in item.iter_markers("flag_effect"))]
    config.hook.pytest_deselected(items=[item for item in items if item not in chosen])
    items[:] = chosen
