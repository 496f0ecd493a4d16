"""Machine state, CPU time, the quality verdict, fair threads and the planted-slowdown knob.

The busy-neighbour tests start real CPU-burning subprocesses beside a real run: they are
``serial`` (run alone, before the parallel suite) so that the only neighbour is the planted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from harness.analyses import diagnose
from harness.measurement import machine_state
from harness.stats import quality
from harness.measurement import runner
from harness.specs.presets import specs_for
from harness.measurement.runner import run_variants
from reference_trainers.runtime import device as dev
from conftest import TINY

BUSY_LOOP = "while True: pass"
# started by a short-lived intermediate process, so the busy loop is not this process's child (a run
# counts its children's CPU time as its own: async env workers)
_ORPHAN = ("import subprocess, sys; "
           "print(subprocess.Popen([sys.executable, '-c', %r], start_new_session=True, "
           "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)" % BUSY_LOOP)


@contextmanager
def busy_neighbours(count: int) -> Iterator[None]:
    """``count`` processes, not children of this one, that each keep a core busy until the block ends."""
    pids = [int(subprocess.run([sys.executable, "-c", _ORPHAN], capture_output=True, text=True, check=True).stdout)
            for _ in range(count)]
    try:
        time.sleep(0.5)  # let them start burning before anything is measured
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _run(*overrides: str, variant: str = "baseline"):  # noqa: ANN202 - a RunResult
    specs = specs_for("ppo-cartpole", variant, [*TINY, "run.repeats=3", "run.steps=256", *overrides])
    (result,), interrupted = run_variants(specs, say=lambda _t: None)
    assert not interrupted
    return result


# --------------------------------------------------------------------------- quality rules (pure)

def _state(shares: list[float], threads: int = 1, cores: int = 2) -> dict:
    return {"usable_cores": cores, "threads": {"intra_op": threads},
            "others_cpu_share": {"median": sorted(shares)[len(shares) // 2], "samples": shares}}


def test_a_quiet_run_with_agreeing_repeats_is_trustworthy() -> None:
    assert quality.assess(_state([0.01, 0.03, 0.0]), [1000.0, 1100.0, 1050.0]) == {"trustworthy": True, "reasons": []}


def test_a_busy_neighbour_makes_a_run_untrustworthy_with_the_share_in_the_reason() -> None:
    verdict = quality.assess(_state([0.6, 0.7, 0.65]), [1000.0, 1100.0, 1050.0])
    assert verdict["trustworthy"] is False
    assert any("other processes took 65% of the 2 usable cores" in r for r in verdict["reasons"])


def test_threads_that_oversubscribe_the_free_cores_are_a_reason() -> None:
    verdict = quality.assess(_state([0.5, 0.5, 0.5], threads=2), [1000.0, 1000.0, 1000.0])
    assert any("2 intra-op threads" in r and "oversubscribe" in r for r in verdict["reasons"])
    alone = quality.assess(_state([0.5, 0.5, 0.5], threads=1), [1000.0, 1000.0, 1000.0])
    assert not any("oversubscribe" in r for r in alone["reasons"])


def test_repeats_far_apart_are_a_reason() -> None:
    verdict = quality.assess(_state([0.0, 0.0]), [736.0, 6454.0])
    assert verdict["trustworthy"] is False and "736 to 6,454" in verdict["reasons"][0]


# --------------------------------------------------------------------------- what a run records

def test_a_run_records_machine_state_cpu_time_and_quality() -> None:
    result = _run()
    state = result.machine_state
    assert state["usable_cores"] >= 1 and state["cpu_count"] >= state["usable_cores"]
    assert len(state["others_cpu_share"]["samples"]) == 3
    assert all(0.0 <= s <= 1.0 for s in state["others_cpu_share"]["samples"])
    assert state["threads"]["intra_op"] >= 1 and state["threads"]["inter_op"] >= 1
    assert set(state["thread_env"]) == set(machine_state.THREAD_ENV_VARS)
    assert state["load_avg_before"] is None or len(state["load_avg_before"]) == 3
    cpu = result.metrics["cpu_seconds_per_1k_env_steps"]
    assert len(cpu["samples"]) == 3 and all(s > 0 for s in cpu["samples"])
    assert set(result.quality) == {"trustworthy", "reasons"}


def _two(overrides: list[str], second: list[str]) -> list:
    """Two baseline specs of ppo-cartpole, ``plain`` and ``second`` (with ``second`` overrides), one thread."""
    common = [*TINY, "run.repeats=3", "run.steps=512", "optimizations.torch_threads=1", *overrides]
    (plain,) = specs_for("ppo-cartpole", "baseline", common)
    (other,) = specs_for("ppo-cartpole", "baseline", [*common, *second])
    return [dataclasses.replace(plain, variant="plain"), dataclasses.replace(other, variant="second")]


def test_cpu_seconds_follow_the_work_not_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A neighbour stretches wall time but not this process's CPU time: sleeping three times each
    iteration's length inside the timed loop cuts env steps/s to about a quarter (the harness's own
    per-iteration work is not stretched, so less on a fast trainer) while CPU seconds per 1k env
    steps stay put (a busy-wait raises both)."""
    real_warm_up = runner._warm_up

    def warm_up_then_sleep(live, progress, run) -> None:  # noqa: ANN001
        real_warm_up(live, progress, run)
        if live.spec.variant != "second":
            return
        inner = live.trainer.iterate

        def iterate():  # noqa: ANN202
            start = time.perf_counter()
            done = inner()
            time.sleep(3 * (time.perf_counter() - start))
            return done
        live.trainer.iterate = iterate

    monkeypatch.setattr(runner, "_warm_up", warm_up_then_sleep)
    (plain, slept), _ = run_variants(_two([], []), say=lambda _t: None)
    wall = slept.metrics["env_steps_per_sec"]["median"] / plain.metrics["env_steps_per_sec"]["median"]
    cpu = (slept.metrics["cpu_seconds_per_1k_env_steps"]["median"]
           / plain.metrics["cpu_seconds_per_1k_env_steps"]["median"])
    assert wall < 0.75
    assert cpu < 1.6  # the CPU time per step stays about where it was (a busy-wait would double it)


@pytest.mark.serial  # a ratio of wall-time rates: another test beside it on a 2-core machine moves it
def test_the_planted_slowdown_knob_slows_a_variant_by_its_percent() -> None:
    """Half the rate. Compared on each variant's fastest repeat: a neighbour only ever adds time, and the
    busy-wait is proportional to the iteration it follows, so a disturbed repeat would count twice."""
    (plain, slow), _ = run_variants(_two([], ["run.planted_slowdown_pct=50"]), say=lambda _t: None)
    ratio = slow.metrics["env_steps_per_sec"]["max"] / plain.metrics["env_steps_per_sec"]["max"]
    assert 0.35 < ratio < 0.7
    cpu = slow.metrics["cpu_seconds_per_1k_env_steps"]["median"] / plain.metrics["cpu_seconds_per_1k_env_steps"]["median"]
    assert cpu > 1.4  # a busy-wait: the planted regression costs CPU like a real one


# --------------------------------------------------------------------------- fair threads

@pytest.mark.parametrize("fair", [True, False])
def test_fair_threads_caps_the_default_thread_count_at_the_free_cores(fair: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # a default of two threads to cap, whatever this process started with (pytest -n workers start with one)
    monkeypatch.setattr(dev, "DEFAULT_THREADS", 2)
    monkeypatch.setattr(dev, "_default_threads", 2)
    busy = machine_state.usable_cores() - 1.0  # all but one core kept busy by others
    monkeypatch.setattr(machine_state, "busy_cores_now", lambda seconds=0.0: busy)
    seen: list[int] = []
    real_warm_up = runner._warm_up

    def warm_up_and_watch(live, progress, run) -> None:  # noqa: ANN001
        real_warm_up(live, progress, run)
        inner = live.trainer.iterate

        def iterate():  # noqa: ANN202
            done = inner()
            seen.append(torch.get_num_threads())
            return done
        live.trainer.iterate = iterate

    monkeypatch.setattr(runner, "_warm_up", warm_up_and_watch)
    result = _run("optimizations.torch_threads=null", f"run.fair_threads={str(fair).lower()}")
    threads = result.machine_state["threads"]
    if fair:
        assert threads == {**threads, "intra_op": 1, "capped_from": dev.DEFAULT_THREADS}
        assert set(seen) == {1}
    else:
        assert threads["intra_op"] == dev.DEFAULT_THREADS and threads["capped_from"] is None
        assert set(seen) == {dev.DEFAULT_THREADS}
    assert dev.default_threads() == dev.DEFAULT_THREADS  # the cap ends with the run


def test_an_explicit_thread_count_is_never_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_state, "busy_cores_now", lambda seconds=0.0: 64.0)
    result = _run("optimizations.torch_threads=2")
    assert result.machine_state["threads"]["intra_op"] == 2 and result.machine_state["threads"]["capped_from"] is None


# --------------------------------------------------------------------------- real neighbours

def _quiet_or_skip(busy: float) -> None:
    """These tests plant a neighbour on a quiet machine; on one that others already keep busy they can
    say nothing (the verdict logic itself is tested above on recorded states)."""
    if busy > 0.5:
        pytest.skip(f"needs a quiet machine to plant a neighbour on: other processes keep {busy:.1f} of "
                    f"{machine_state.usable_cores()} cores busy")


@pytest.mark.serial
@pytest.mark.machine_load
def test_the_meter_sees_a_real_busy_neighbour() -> None:
    quiet = machine_state.busy_cores_now(0.5)
    _quiet_or_skip(quiet)
    with busy_neighbours(1):
        busy = machine_state.busy_cores_now(0.5)
    assert busy > quiet + 0.5


@pytest.mark.serial
@pytest.mark.machine_load
def test_the_quality_verdict_flips_when_real_busy_processes_run_beside_a_run() -> None:
    _quiet_or_skip(machine_state.busy_cores_now(0.5))
    quiet = _run(variant="optimized")
    if any("other processes took" in reason for reason in quiet.quality["reasons"]):
        pytest.skip(f"needs a quiet machine to plant a neighbour on: {quiet.quality['reasons'][0]}")
    with busy_neighbours(machine_state.usable_cores()):
        loaded = _run(variant="optimized")
    assert quiet.quality["trustworthy"] is True, quiet.quality["reasons"]
    assert loaded.quality["trustworthy"] is False
    assert any("other processes took" in reason for reason in loaded.quality["reasons"])
    assert loaded.machine_state["busy_cores_before"] > quiet.machine_state["busy_cores_before"] + 0.5


def test_diagnose_says_what_the_load_does_to_its_figures() -> None:
    result = _run()
    result.quality = {"trustworthy": False, "reasons": ["other processes took 60% of the 2 usable cores"]}
    result.machine_state["others_cpu_share"]["median"] = 0.6
    lines = diagnose.diagnosis_lines(diagnose.diagnosis(result, None, None))
    text = "\n".join(lines)
    assert "other processes took 60% of the" in text and "re-run on a quieter machine" in text
