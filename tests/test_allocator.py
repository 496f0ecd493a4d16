"""Tests for ``optimizations.heap_retention``: retained, a process stops faulting in fresh pages
for arrays it frees and allocates again (switched off, it faults again), every trainer keeps its
setting in force while it updates, a user's trainer keeps what its factory set, and a C library
without glibc's ``mallopt`` is a clear error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from flag_effects import at_each_update, iterate_against, running

from reference_trainers.common import allocator
from reference_trainers.common.allocator import heap_retention
from reference_trainers.common.config import ConfigError, build_config
from reference_trainers.common.resolve import resolve_config

ROOT = Path(__file__).resolve().parents[1]
needs_glibc = pytest.mark.skipif(allocator.unavailable_reason() is not None,
                                 reason="heap retention sets glibc's malloc thresholds")

_FAULTS = """
import resource, sys
import numpy as np
from reference_trainers.common.allocator import heap_retention
if sys.argv[1] in ("retained", "switched-off"):
    heap_retention.apply(True)
if sys.argv[1] == "switched-off":
    heap_retention.apply(False)
def steps(count):  # a step's worth of 1 MB arrays, all freed together, as a minibatch's are
    for _ in range(count):
        arrays = [np.ones(256 * 1024, dtype=np.float32) for _ in range(8)]
        del arrays
steps(3)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
steps(20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
PAGES_TOUCHED = 20 * 8 * 1024 * 1024 // 4096
"""Pages the 20 measured steps write (each faults once where its block comes fresh from the kernel)."""


def _page_faults(state: str) -> int:
    """Minor page faults of 20 steps of freed and reallocated 1 MB arrays, in a fresh process."""
    out = subprocess.run([sys.executable, "-c", _FAULTS, state], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=120)
    return int(out.stdout.split()[-1])


@needs_glibc
@pytest.mark.flag_effect("optimizations.heap_retention")
def test_retained_heap_reuses_its_pages_and_switched_off_faults_them_in_again() -> None:
    untouched, retained, switched_off = (_page_faults(state) for state in ("untouched", "retained", "switched-off"))
    assert untouched > PAGES_TOUCHED // 2, "glibc's own thresholds were expected to fault these arrays in"
    assert retained < PAGES_TOUCHED // 50, f"{retained} page faults with the heap retained"
    assert switched_off > PAGES_TOUCHED // 2, "switching retention off should put glibc's default thresholds back"


@needs_glibc
@pytest.mark.flag_effect("optimizations.heap_retention")
@pytest.mark.parametrize("algo", ["ppo", "ppo-lstm", "dqn", "iqn"])
@pytest.mark.parametrize("retain", [False, True])
def test_every_trainer_keeps_its_heap_retention_in_force_while_it_updates(algo: str, retain: bool) -> None:
    seen: list[bool] = []
    with running(algo, f"optimizations.heap_retention={str(retain).lower()}") as trainer:
        at_each_update(trainer, lambda: seen.append(heap_retention.retaining))
        iterate_against(trainer, lambda: heap_retention.apply(not retain))
    assert seen and set(seen) == {retain}


@needs_glibc
def test_a_users_trainer_keeps_the_retention_its_factory_left() -> None:
    from harness.own_trainer import OwnConfig, OwnTrainer
    from reference_trainers.common.probe import NullProbe

    class Minimal:
        def iterate(self) -> int:
            return 1

        def close(self) -> None:
            pass

    def retaining_factory(config: dict, *, device: str, seed: int) -> Minimal:
        heap_retention.apply(True)
        return Minimal()

    def plain_factory(config: dict, *, device: str, seed: int) -> Minimal:
        return Minimal()

    heap_retention.apply(True)  # another arm left it on: a plain factory starts from glibc's own thresholds
    plain = OwnTrainer(plain_factory, OwnConfig("plain", {}), "cpu", NullProbe())
    assert not heap_retention.retaining
    retaining = OwnTrainer(retaining_factory, OwnConfig("retaining", {}), "cpu", NullProbe())
    for trainer, expected in ((plain, False), (retaining, True), (plain, False)):
        trainer.iterate()
        assert heap_retention.retaining is expected
    heap_retention.apply(False)


def test_without_glibc_auto_stays_plain_and_true_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    why = "it sets glibc's malloc thresholds, and this process's C library is not glibc (Darwin)"
    monkeypatch.setattr(allocator, "unavailable_reason", lambda: why)
    tiny = ["algo=ppo", "device=cpu", "env.id=CartPole-v1", "env.num_envs=2"]
    resolved = resolve_config(build_config({}, [*tiny, "optimizations.heap_retention=auto"]))
    assert resolved.config.optimizations.heap_retention is False
    assert why in resolved.reasons["optimizations.heap_retention"]
    with pytest.raises(ConfigError, match="heap_retention.*not glibc"):
        resolve_config(build_config({}, [*tiny, "optimizations.heap_retention=true"]))


def test_switching_on_without_mallopt_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "glibc_mallopt", lambda: None)
    with pytest.raises(RuntimeError, match="heap_retention"):
        allocator.HeapRetention().apply(True)
