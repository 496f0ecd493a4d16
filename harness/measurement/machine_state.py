"""The state of the machine around a measurement: load, the CPU other processes take, threads.

A neighbour that keeps cores busy slows a run in wall time but not in its own CPU time, and
a variant whose intra-op threads spin against it slows far more than one that runs a single
thread. So every run records what else the machine was doing while it was timed:

- ``busy_cores_before``: cores other processes kept busy in a short sample before the run
  (what ``run.fair_threads`` caps torch's default thread count with);
- ``others_cpu_share``: per timed segment, the share of this process's usable cores that
  other processes used (system busy time on those cores minus this process's own CPU time,
  children included, over the segment's wall time);
- load averages before and after, core counts and affinity, each variant's threads, and the
  thread variables of the OpenMP / MKL / OpenBLAS runtimes;
- ``heap_retained``: whether glibc's malloc thresholds were fixed high (``run.heap_retention``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import psutil

from harness.measurement import metrics
from harness.measurement.allocator import heap_retention

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
BEFORE_SAMPLE_S = 0.3
"""Length of the sample of other processes' CPU use taken before a run."""


def affinity() -> list[int] | None:
    """CPUs this process may run on (None where the platform does not say)."""
    try:
        return sorted(psutil.Process().cpu_affinity())
    except (AttributeError, psutil.Error, OSError):
        return None


def usable_cores() -> int:
    cpus = affinity()
    return len(cpus) if cpus else (os.cpu_count() or 1)


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (None where the platform has none)."""
    try:
        return [round(x, 2) for x in psutil.getloadavg()]
    except (AttributeError, OSError):
        return None


def thread_env() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in THREAD_ENV_VARS}


def _busy_seconds(cpus: list[int] | None) -> float:
    """Busy (non-idle, non-iowait) CPU seconds since boot, summed over ``cpus`` (all when None)."""
    per_cpu = psutil.cpu_times(percpu=True)
    chosen = per_cpu if not cpus else [per_cpu[i] for i in cpus if i < len(per_cpu)]
    return sum(sum(t) - t.idle - getattr(t, "iowait", 0.0) for t in chosen)


class OthersMeter:
    """CPU other processes use on this process's cores between ``start`` and ``share``, less this
    process's own (``own_cpu_seconds``: children included)."""

    def __init__(self, own_cpu_seconds: Callable[[], float] = metrics.process_cpu_seconds) -> None:
        self.own_cpu_seconds = own_cpu_seconds
        self.cpus = affinity()
        self.cores = len(self.cpus) if self.cpus else (os.cpu_count() or 1)
        self._start: tuple[float, float, float] | None = None

    def _now(self) -> tuple[float, float, float]:
        return time.perf_counter(), _busy_seconds(self.cpus), self.own_cpu_seconds()

    def start(self) -> None:
        self._start = self._now()

    def busy_cores(self) -> float:
        """Cores other processes kept busy since ``start`` (0 when too little time passed)."""
        if self._start is None:
            raise RuntimeError("OthersMeter.stop before start")
        (w0, b0, o0), (w1, b1, o1) = self._start, self._now()
        wall = w1 - w0
        if wall <= 0:
            return 0.0
        # /proc/stat counts in clock ticks: a short segment can read a little negative
        return max(0.0, min(float(self.cores), ((b1 - b0) - (o1 - o0)) / wall))

    def share(self) -> float:
        """``busy_cores()`` as a fraction of this process's usable cores."""
        return self.busy_cores() / self.cores


def busy_cores_now(seconds: float = BEFORE_SAMPLE_S) -> float:
    """Cores other processes keep busy, sampled over ``seconds`` while this process sleeps."""
    meter = OthersMeter()
    meter.start()
    time.sleep(seconds)
    return meter.busy_cores()


def retain_heap(wanted: Iterable[bool]) -> None:
    """Under ``run.heap_retention`` (every arm's), glibc's malloc thresholds fixed high before the
    arms are built (``allocator``); ``record`` reports whether they are."""
    if all(wanted):
        heap_retention.retain()


def free_cores(busy: float) -> int:
    """Whole cores left to this process when others keep ``busy`` cores busy (at least one)."""
    return max(1, int(round(usable_cores() - busy)))


@dataclass
class Snapshot:
    """What the machine looked like just before the variants of one run started."""

    load_avg_before: list[float] | None
    busy_cores_before: float
    cpu_count: int
    usable_cores: int
    affinity: list[int] | None

    @classmethod
    def take(cls) -> "Snapshot":
        return cls(load_average(), round(busy_cores_now(), 2), os.cpu_count() or 1, usable_cores(), affinity())

    def record(self, others_shares: list[float], threads: dict[str, Any]) -> dict[str, Any]:
        """A run's ``machine_state`` block (the load average after is read now)."""
        return {
            "cpu_count": self.cpu_count, "usable_cores": self.usable_cores, "affinity": self.affinity,
            "load_avg_before": self.load_avg_before, "load_avg_after": load_average(),
            "busy_cores_before": self.busy_cores_before,
            "others_cpu_share": metrics.spread(others_shares) if others_shares else None,
            "threads": threads, "thread_env": thread_env(), "heap_retained": heap_retention.retained,
        }


def fair_threads_cap(fair_threads: bool) -> int | None:
    """``run.fair_threads``: torch's default thread count capped at the cores other processes keep free now
    (None where nothing is to be capped: the setting off, or enough cores free)."""
    from reference_trainers.runtime import device as dev

    if not fair_threads:
        return None
    cap = free_cores(Snapshot.take().busy_cores_before)
    return cap if cap < dev.DEFAULT_THREADS else None
