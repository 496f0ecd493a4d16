"""Measure a training loop in place, for a loop that cannot be restructured into ``iterate()``::

    from harness import measure

    with measure("my-run", out="result.json") as m:
        for update in range(n):
            with m.phase("env"):
                ...
            m.steps(num_envs * num_steps)

The warm-up (until ``warmup_steps`` env steps, at least the first ``m.steps`` call) is untimed and
runs under the float64 sentinel, as ``rlgauge run``'s checked iteration does: a float64 op there
makes the run unstable. The loop's env steps past the warm-up are cut into timed repeats of
``steps_per_repeat`` env steps each; every repeat records its wall time, the process's CPU time
and the CPU share other processes took, exactly as ``rlgauge run`` does, and the phase split
covers the timed repeats. On leaving the block the run is written to ``out`` in the result
schema (a file that already holds runs keeps them; a run of the same name and variant is
replaced), so ``compare``, ``gate`` and ``record`` read it. A block left by an exception is
written as failed (by Ctrl-C: interrupted) and the exception goes on. On leaving, one line on
stderr says the run's status and rate (and, for an unstable run, its first float64 site).

A script whose loop cannot be re-indented under ``with`` uses the start/stop form, two lines
at the loop's own indentation::

    m = measure("my-run", out="result.json").start()   # before the loop
    for update in range(n):
        ...
        m.steps(num_envs * num_steps)                     # inside the loop
    m.stop()                                              # after it (or let the script end)

A started measurement not stopped is stopped when the interpreter exits, as failed when the
script ended with an uncaught exception.
"""

from __future__ import annotations

import atexit
import datetime as dt
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from harness.measurement import metrics
from harness.stats import quality
from harness.errors import UserError
from harness.measurement.machine_state import OthersMeter, Snapshot
from harness.specs.own_trainer import ALGO
from harness.results import RunResult, check_writable, load_results, save_results
from harness.measurement.sentinels import Float64Sentinel


@dataclass
class _Repeat:
    steps: int
    seconds: float
    cpu_seconds: float
    others_share: float


class Measurement(AbstractContextManager["Measurement"]):
    """The ``with`` block of ``measure``: count env steps, time phases, write the run on exit."""

    def __init__(self, name: str, *, out: str | Path | None = None, variant: str = "config",
                 steps_per_repeat: int = 4096, warmup_steps: int = 0, device: str = "cpu",
                 config: dict[str, Any] | None = None) -> None:
        if not isinstance(steps_per_repeat, int) or steps_per_repeat < 1:
            raise UserError(f"measure: steps_per_repeat={steps_per_repeat!r}; accepted: an integer >= 1")
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise UserError(f"measure: warmup_steps={warmup_steps!r}; accepted: an integer >= 0")
        self.name, self.variant, self.device = name, variant, device
        self.out = Path(out) if out is not None else None
        self.steps_per_repeat, self.warmup_steps = steps_per_repeat, warmup_steps
        self.settings = dict(config or {})
        self.probe = metrics.TimingProbe()
        self.repeats: list[_Repeat] = []
        self.result: RunResult | None = None
        self._steps = 0
        self._in_repeat = 0
        self._started_at = ""
        self._warmup_s = 0.0
        self._begun = 0.0
        self.float64_ops, self.float64_site = 0, None

    # ------------------------------------------------------------------ the user's side
    def phase(self, name: str) -> AbstractContextManager[None]:
        """Time one phase (env, inference, update, transfer, logging) of the timed repeats."""
        return self.probe.phase(name) if self.probe.enabled else nullcontext()

    def steps(self, count: int) -> None:
        """Add ``count`` env steps (call it once per rollout, update or chunk)."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise UserError(f"measure {self.name}: steps({count!r}); accepted: a positive int (env steps taken)")
        self._steps += count
        if self._repeat_open:
            self._in_repeat += count
            if self._in_repeat >= self.steps_per_repeat:
                self._close_repeat()
                self._open_repeat()
        elif self._steps >= self.warmup_steps:
            self._warmup_s = time.perf_counter() - self._begun
            self._end_sentinel()
            self._open_repeat()

    # ------------------------------------------------------------------ the start/stop form
    def start(self) -> "Measurement":
        """Begin measuring without a ``with`` block; ``stop()`` ends it (or the interpreter's exit)."""
        self.__enter__()
        self._uncaught: BaseException | None = None
        previous = sys.excepthook

        def remember(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            self._uncaught = exc
            previous(kind, exc, tb)

        sys.excepthook = remember
        self._previous_hook = previous
        atexit.register(self._stop_at_exit)
        return self

    def stop(self) -> RunResult:
        """End a ``start()``-ed measurement: write the run and return it."""
        if self.result is None:
            self.__exit__(None, None, None)
        self._release()
        assert self.result is not None
        return self.result

    def _release(self) -> None:
        if getattr(self, "_previous_hook", None) is not None:
            sys.excepthook = self._previous_hook
            self._previous_hook = None
            atexit.unregister(self._stop_at_exit)

    def _stop_at_exit(self) -> None:
        if self.result is None:
            exc = getattr(self, "_uncaught", None)
            self.__exit__(type(exc) if exc is not None else None, exc, None)

    # ------------------------------------------------------------------ the clock
    _repeat_open = False

    def _open_repeat(self) -> None:
        self._cpu = metrics.ProcessCpu()
        self._others = OthersMeter(self._cpu.seconds)
        self._others.start()
        self._wall0, self._cpu0 = time.perf_counter(), self._cpu.seconds()
        self._in_repeat = 0
        self._repeat_open = True
        self.probe.enabled = True

    def _close_repeat(self) -> None:
        wall, cpu = time.perf_counter() - self._wall0, self._cpu.seconds() - self._cpu0
        self.repeats.append(_Repeat(self._in_repeat, wall, cpu, self._others.share()))
        self._repeat_open = False
        self.probe.enabled = False

    def __enter__(self) -> "Measurement":
        if self.out is not None:
            check_writable(self.out)
        self._snapshot = Snapshot.take()
        import torch

        self._threads = torch.get_num_threads()
        self._started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self._begun = time.perf_counter()
        self._sentinel: Float64Sentinel | None = Float64Sentinel()
        self._sentinel.__enter__()
        return self

    def _end_sentinel(self) -> None:
        if self._sentinel is not None:
            self._sentinel.__exit__(None, None, None)
            self.float64_ops, self.float64_site = self._sentinel.count, self._sentinel.first_site
            self._sentinel = None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._repeat_open = False  # a partial last repeat is not a repeat
        self.probe.enabled = False
        self._end_sentinel()
        status, error = "ok", None
        if kind is KeyboardInterrupt:
            status = "interrupted"
        elif exc is not None:
            status, error = "failed", f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        elif not self.repeats:
            status = "failed"
            error = (f"no timed repeat: {self._steps:,} env steps counted, {self.warmup_steps:,} of warm-up and "
                     f"{self.steps_per_repeat:,} per repeat needed")
        if status == "ok" and self.float64_ops:
            status = "unstable"
        self.result = self._result(status, error)
        if self.out is not None:
            kept = [r for r in (load_results(self.out) if self.out.exists() else [])
                    if (r.preset, r.variant) != (self.name, self.variant)]
            save_results(self.out, [*kept, self.result])
        print(summary_line(self.result, self.out), file=sys.stderr)

    # ------------------------------------------------------------------ the result
    def _result(self, status: str, error: str | None) -> RunResult:
        from harness.measurement.provenance import git_info, machine_info
        import torch

        rates = [r.steps / r.seconds for r in self.repeats if r.seconds > 0]
        measured = bool(rates) and status in ("ok", "unstable")
        timed_steps = sum(r.steps for r in self.repeats)
        state = self._snapshot.record([r.others_share for r in self.repeats],
                                      {"intra_op": self._threads, "inter_op": torch.get_num_interop_threads(),
                                       "capped_from": None})
        metrics_block = {
            "env_steps_per_sec": metrics.spread(rates) if measured else None,
            "agent_steps_per_sec": metrics.spread(rates) if measured else None,
            "updates_per_sec": None,
            "cpu_seconds_per_1k_env_steps": metrics.spread([1000 * r.cpu_seconds / r.steps for r in self.repeats])
            if measured else None,
            "inference_latency_ms": None, "phase_seconds": self.probe.totals(),
            "peak_host_rss_mb": metrics.host_rss_mb(), "peak_device_mem_mb": None, "device_utilization_pct": None,
            "host_syncs_per_step": None, "warmup_s": self._warmup_s, "mean_return_last_k": None,
        }
        run = {"steps": self.steps_per_repeat, "warmup_steps": self.warmup_steps, "repeats": len(self.repeats)}
        return RunResult(
            preset=self.name, variant=self.variant, algo=ALGO, status=status, started_at=self._started_at,
            git=git_info(Path.cwd()), machine={**machine_info(torch.device(self.device)), "world_size": 1},
            config={"trainer": None, "device": self.device, "seed": None, "interleaved": False, "run": run,
                    "config": self.settings},
            metrics=metrics_block, stability={"float64_ops": self.float64_ops, "nonfinite_events": 0,
                                              "compile_fallback": False, "passed": status == "ok",
                                              **({"float64_first_site": self.float64_site} if self.float64_site else {})},
            steps_completed=timed_steps if measured else 0, error=error, machine_state=state,
            quality=quality.assess(state, rates) if measured else None)


def measure(name: str, *, out: str | Path | None = None, variant: str = "config", steps_per_repeat: int = 4096,
            warmup_steps: int = 0, device: str = "cpu", config: dict[str, Any] | None = None) -> Measurement:
    """A ``with`` block that measures a training loop in place (module docstring). ``variant`` names
    this run in ``out`` (measure a baseline and an optimized block into one file, then ``rlgauge
    compare out.json``); ``config`` is recorded as the run's settings."""
    return Measurement(name, out=out, variant=variant, steps_per_repeat=steps_per_repeat,
                       warmup_steps=warmup_steps, device=device, config=config)


def summary_line(result: RunResult, out: Path | None) -> str:
    """``rlgauge: measure NAME (VARIANT): STATUS, RATE env steps/s [min-max] over R repeats[, written to OUT]``."""
    from harness.measurement.sentinels import instability

    rate = result.metrics.get("env_steps_per_sec")
    figures = (f"{rate['median']:,.0f} env steps/s [{rate['min']:,.0f}-{rate['max']:,.0f}] over "
               f"{len(rate['samples'])} repeats") if rate else "no rate"
    why = result.error if result.status == "failed" else instability(result.stability) \
        if result.status == "unstable" else ""
    return (f"rlgauge: measure {result.preset} ({result.variant}): {result.status}, {figures}"
            + (f"; {why}" if why else "") + (f"; written to {out}" if out is not None else ""))

