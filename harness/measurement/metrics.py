"""The only place that computes rates, percentiles, memory and utilisation."""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections import defaultdict

import numpy as np
import psutil

from reference_trainers.runtime.probe import PHASES


def spread(samples: list[float]) -> dict[str, float | list[float]]:
    """Median with min-max spread and the raw samples (a rate measured once per repeat)."""
    return {"median": float(statistics.median(samples)), "min": float(min(samples)), "max": float(max(samples)),
            "samples": [float(s) for s in samples]}


def latency_percentiles(seconds: list[float]) -> dict[str, float]:
    """p50 / p95 of per-call latencies, in milliseconds."""
    ms = np.asarray(seconds, dtype=np.float32) * 1000.0
    return {"p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95))}


def seconds_since_process_start() -> float:
    """Wall seconds since this process was created (its imports and start-up included)."""
    return max(0.0, time.time() - psutil.Process().create_time())


def host_rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def process_cpu_seconds() -> float:
    """User + system CPU time of this process and its children (async env workers)."""
    proc = psutil.Process()
    total = sum(proc.cpu_times()[:2])
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])
    return total


class ProcessCpu:
    """CPU seconds of this process and of the children it had when created (async env workers),
    cheap enough to read inside a timed segment: the children are looked up once, here, since a
    lookup scans every process on the machine."""

    def __init__(self) -> None:
        self.children = psutil.Process().children(recursive=True)

    def seconds(self) -> float:
        total = time.process_time()
        for child in self.children:
            with contextlib.suppress(psutil.Error):
                total += sum(child.cpu_times()[:2])
        return total


class _PhaseTimer:
    """One timed phase: adds its wall seconds to ``seconds[name]`` on exit (exceptions too).
    A plain class rather than a generator context manager: a trainer enters several phases
    per env step, and the probe's own cost is charged to the run it measures."""

    __slots__ = ("seconds", "name", "start")

    def __init__(self, seconds: dict[str, float], name: str) -> None:
        self.seconds, self.name = seconds, name

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc_info: object) -> None:
        self.seconds[self.name] += time.perf_counter() - self.start


class TimingProbe:
    """Accumulates wall seconds per phase (host-side wall time; on CUDA queued kernels are
    charged to whichever phase waits for them)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.enabled = False

    _off = contextlib.nullcontext()

    def phase(self, name: str):  # noqa: ANN201 - returns a context manager
        return _PhaseTimer(self.seconds, name) if self.enabled else self._off

    def totals(self) -> dict[str, float]:
        return {name: float(self.seconds.get(name, 0.0)) for name in PHASES}


class RateWindow:
    """Steps per second over the last few updates (for the progress bar, not the result)."""

    def __init__(self, horizon: int = 8) -> None:
        self.points: list[tuple[float, int]] = []
        self.horizon = horizon

    def add(self, steps_total: int) -> float | None:
        self.points = (self.points + [(time.perf_counter(), steps_total)])[-self.horizon:]
        if len(self.points) < 2:
            return None
        (t0, s0), (t1, s1) = self.points[0], self.points[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None


class CompileCacheMeter:
    """Inductor's compiled-graph cache lookups (``fxgraph_cache_hit`` / ``_miss`` / ``_bypass``) made
    while active: whether an arm's compile time was a cold compile or a load from the cache, which
    ``warmup_s`` and ``end_to_end_s`` depend on. Lookups happen only where something compiles."""

    KINDS = ("hit", "miss", "bypass")

    def __init__(self) -> None:
        self.counts = dict.fromkeys(self.KINDS, 0)

    @staticmethod
    def _read() -> dict[str, int]:
        if "torch._dynamo" not in sys.modules:  # nothing compiled yet: do not import it to look
            return dict.fromkeys(CompileCacheMeter.KINDS, 0)
        from torch._dynamo.utils import counters

        return {kind: int(counters["inductor"][f"fxgraph_cache_{kind}"]) for kind in CompileCacheMeter.KINDS}

    @contextlib.contextmanager
    def active(self):  # noqa: ANN201
        before = self._read()
        try:
            yield self
        finally:
            after = self._read()
            for kind in self.KINDS:
                self.counts[kind] += after[kind] - before[kind]

    def summary(self) -> dict[str, int] | None:
        """``{"hit": n, "miss": m, "bypass": b}``, or None where nothing was looked up (nothing compiled)."""
        return dict(self.counts) if any(self.counts.values()) else None
