"""Tests for ``run.heap_retention``: with the thresholds fixed, a process stops faulting in fresh
pages for arrays it frees and allocates again; ``run`` and ``learn`` fix them before the arms are
built unless an arm says false, and the result records the state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY

from harness.measurement import allocator
from harness.measurement import machine_state
from harness.cli import main
from harness.specs.presets import specs_for
from harness.measurement.runner import run_variants

ROOT = Path(__file__).resolve().parents[1]
needs_glibc = pytest.mark.skipif(allocator.glibc_mallopt() is None, reason="heap retention sets glibc's thresholds")

_FAULTS = """
import resource, sys
import numpy as np
from harness.measurement.allocator import heap_retention
if sys.argv[1] == "retained":
    assert heap_retention.retain()
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
def test_retained_heap_reuses_its_pages_where_glibcs_own_thresholds_fault_them_in() -> None:
    untouched, retained = _page_faults("untouched"), _page_faults("retained")
    assert untouched > PAGES_TOUCHED // 2, "glibc's adaptive thresholds were expected to fault these arrays in"
    assert retained < PAGES_TOUCHED // 50, f"{retained} page faults with the thresholds fixed"


@pytest.fixture
def fresh_heap(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """A process state not yet retained, whose ``retain`` calls are recorded (and made for real)."""
    state = allocator.HeapRetention()
    calls: list[bool] = []
    real = state.retain
    monkeypatch.setattr(state, "retain", lambda: calls.append(True) or real())
    monkeypatch.setattr(machine_state, "heap_retention", state)
    return calls


@needs_glibc
@pytest.mark.parametrize("retain", [True, False])
def test_run_fixes_the_thresholds_before_the_arms_unless_an_arm_says_false(fresh_heap: list[bool],
                                                                           retain: bool) -> None:
    sets = [*TINY, "run.repeats=1", "run.steps=64"]
    specs = [*specs_for("ppo-cartpole", "baseline", [*sets, f"run.heap_retention={str(retain).lower()}"]),
             *specs_for("ppo-cartpole", "optimized", sets)]
    results, _ = run_variants(specs, say=lambda _t: None)
    assert fresh_heap == ([True] if retain else [])
    assert [r.machine_state["heap_retained"] for r in results] == [retain, retain]


@needs_glibc
def test_learn_fixes_the_thresholds_in_every_jobs_process_and_records_it(tmp_path: Path) -> None:
    out = tmp_path / "learn"
    sets = [a for item in TINY for a in ("--set", item)]
    assert main(["learn", "ppo-cartpole", "--seeds", "2", "--steps", "1000", *sets, "--quiet", "--out", str(out)]) == 0
    assert json.loads((out / "learn.json").read_text())["machine_state"]["heap_retained"] is True
    assert main(["learn", "ppo-cartpole", "--seeds", "2", "--steps", "1000", *sets, "--quiet", "--out",
                 str(tmp_path / "kept"), "--set", "run.heap_retention=false"]) == 0
    assert json.loads((tmp_path / "kept" / "learn.json").read_text())["machine_state"]["heap_retained"] is False


@needs_glibc
def test_a_campaign_run_in_this_process_fixes_the_thresholds_once(fresh_heap: list[bool]) -> None:
    from harness.analyses import learn
    from harness.campaigns.executors import LocalExecutor

    plans = learn.plan_campaign("ppo-cartpole", list(TINY), peer=None, seeds=2, steps=1000, first_seed=1,
                                trainer=None, config=None)
    record = learn.run_campaign(plans, LocalExecutor())
    assert fresh_heap == [True] and record.machine_state["heap_retained"] is True


def test_without_glibc_nothing_is_fixed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "glibc_mallopt", lambda: None)
    state = allocator.HeapRetention()
    assert state.retain() is False and state.retained is False
