"""Run configs -> RunResults: warm-up, interleaved timed repeats, latency, sentinel check.

Several variants measured together are interleaved repeat by repeat (the order rotated by
one each round, so each variant takes every slot in turn), so machine drift hits every
variant alike and their ratios are robust on a noisy machine.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from reference_trainers import build_trainer
from reference_trainers.common import device as dev
from reference_trainers.common.config import TrainConfig, to_plain_dict
from reference_trainers.common.resolve import Resolution, optimisation_summary, resolve_config
from reference_trainers.ppo import NonFiniteError

from . import metrics
from .progress import RunProgress
from .provenance import git_info, machine_info
from .results import RunResult
from .sentinels import Float64Sentinel, HostSyncCounter

log = logging.getLogger("rlgauge")


@dataclass
class VariantSpec:
    """One thing to measure: a preset's variant (or a config file) and its config."""

    preset: str
    variant: str
    config: TrainConfig
    build: Callable[..., object] | None = None
    """Trainer factory ``build(resolution, probe=...)``; None = the reference trainer of ``config.algo``."""


@dataclass
class _Live:
    """Measurement state of one variant while the run goes on."""

    spec: VariantSpec
    resolution: Resolution
    trainer: object = None
    probe: metrics.TimingProbe = field(default_factory=metrics.TimingProbe)
    started_at: str = ""
    warmup_s: float = 0.0
    env_rates: list[float] = field(default_factory=list)
    agent_rates: list[float] = field(default_factory=list)
    update_rates: list[float] = field(default_factory=list)
    timed_seconds: float = 0.0
    cpu_seconds: float = 0.0
    timed_steps: int = 0
    peak_rss_mb: float = 0.0
    latency: dict[str, float] | None = None
    syncs_per_step: float | None = None
    float64_ops: int = 0
    float64_site: str | None = None
    torch_threads: int | None = None
    error: str | None = None
    status: str = "ok"


def resolve_specs(specs: list[VariantSpec]) -> list[Resolution]:
    """Resolve every variant before anything runs, so a bad flag fails fast."""
    return [resolve_config(spec.config) for spec in specs]


def rotated(items: list, round_index: int) -> list:
    """``items`` rotated left by ``round_index`` (two items: alternating order)."""
    shift = round_index % len(items) if items else 0
    return items[shift:] + items[:shift]


def run_variants(specs: list[VariantSpec], *, show_progress: bool = False,
                 say: Callable[[str], None] = print) -> tuple[list[RunResult], bool]:
    """Measure each spec; returns (results, interrupted)."""
    lives = [_Live(spec, res) for spec, res in zip(specs, resolve_specs(specs))]
    for live in lives:
        if live.spec.build is None:
            say(f"{live.spec.variant}: {optimisation_summary(live.resolution.config)}")
        else:
            say(f"{live.spec.variant}: peer trainer, matched from the {live.resolution.config.env.id} config; "
                f"process settings: threads={live.resolution.config.optimizations.torch_threads or 'default'}")
    total = sum(l.resolution.config.run.warmup_steps + l.resolution.config.run.repeats * l.resolution.config.run.steps
                for l in lives)
    interrupted = False
    saved = dev.process_settings()
    with RunProgress(total, enabled=show_progress) as progress:
        try:
            for live in lives:
                _warm_up(live, progress)
            rounds = max(l.resolution.config.run.repeats for l in lives)
            for r in range(rounds):
                order = rotated(lives, r)
                for live in order:
                    if r < live.resolution.config.run.repeats and live.status == "ok":
                        _timed_segment(live, progress)
            for live in lives:
                if live.status == "ok":
                    _latency_and_sentinels(live)
        except KeyboardInterrupt:
            interrupted = True
            for live in lives:
                live.status = "interrupted"
        finally:
            for live in lives:
                if live.trainer is not None:
                    live.trainer.close()
            dev.restore_process_settings(saved)
    return [_result(live) for live in lives], interrupted


def _warm_up(live: _Live, progress: RunProgress) -> None:
    live.started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    start = time.perf_counter()
    budget = live.resolution.config.run.warmup_steps
    progress.describe(f"{live.spec.variant} warm-up")
    try:
        live.trainer = (live.spec.build or build_trainer)(live.resolution, probe=live.probe)
        live.torch_threads = live.resolution.config.optimizations.torch_threads or dev.DEFAULT_THREADS
        dev.reset_peak_memory(live.resolution.device)
        while True:
            done = live.trainer.iterate()
            progress.advance(done.env_steps, live.trainer.env_steps)
            if live.trainer.env_steps >= budget:
                break
    except Exception as exc:  # the trainer failed: record it, keep the other variants going
        _failed(live, exc)
    dev.synchronize(live.resolution.device)
    live.warmup_s = time.perf_counter() - start


def _failed(live: _Live, exc: Exception) -> None:
    live.status = "failed"
    live.error = str(exc) if isinstance(exc, NonFiniteError) else f"{type(exc).__name__}: {exc}"
    log.error("%s %s failed: %s", live.spec.preset, live.spec.variant, live.error)


def _timed_segment(live: _Live, progress: RunProgress) -> None:
    trainer, steps = live.trainer, live.resolution.config.run.steps
    progress.describe(live.spec.variant)
    frames = decisions = updates = 0
    live.probe.enabled = True
    cpu0, start = metrics.process_cpu_seconds(), time.perf_counter()
    try:
        while frames < steps:
            done = trainer.iterate()
            frames += done.env_steps
            decisions += done.agent_steps
            updates += done.updates
            live.peak_rss_mb = max(live.peak_rss_mb, metrics.host_rss_mb())
            progress.advance(done.env_steps, trainer.env_steps)
        dev.synchronize(live.resolution.device)
    except Exception as exc:
        _failed(live, exc)
        return
    finally:
        live.probe.enabled = False
        wall = time.perf_counter() - start
        live.timed_seconds += wall
        live.cpu_seconds += metrics.process_cpu_seconds() - cpu0
        live.timed_steps += frames
    live.env_rates.append(frames / wall)
    live.agent_rates.append(decisions / wall)
    live.update_rates.append(updates / wall)


def _latency_and_sentinels(live: _Live) -> None:
    """Inference latency of one batched action selection, then one checked iteration."""
    trainer, device = live.trainer, live.resolution.device
    trainer.activate()
    obs = np.array(trainer.next_obs, copy=True)
    seconds = []
    for _ in range(live.resolution.config.run.latency_samples):
        start = time.perf_counter()
        trainer.select_actions(obs)
        dev.synchronize(device)
        seconds.append(time.perf_counter() - start)
    live.latency = metrics.latency_percentiles(seconds)

    syncs, wide = HostSyncCounter(device), Float64Sentinel()
    try:
        with syncs.active(), wide:
            done = trainer.iterate()
    except Exception as exc:
        _failed(live, exc)
        return
    vector_steps = max(1, done.agent_steps // live.resolution.config.env.num_envs)
    live.syncs_per_step = syncs.count / vector_steps
    live.float64_ops, live.float64_site = wide.count, wide.first_site


def _result(live: _Live) -> RunResult:
    cfg, trainer = live.resolution.config, live.trainer
    rates = live.env_rates
    measured = bool(rates)
    util = None
    if measured and live.resolution.device.type == "cpu" and live.timed_seconds > 0:
        util = 100.0 * live.cpu_seconds / live.timed_seconds
    metrics_block = {
        "env_steps_per_sec": metrics.spread(rates) if measured else None,
        "agent_steps_per_sec": metrics.spread(live.agent_rates) if measured else None,
        "updates_per_sec": metrics.spread(live.update_rates) if measured else None,
        "inference_latency_ms": live.latency,
        "phase_seconds": live.probe.totals(),
        "peak_host_rss_mb": live.peak_rss_mb or metrics.host_rss_mb(),
        "peak_device_mem_mb": dev.peak_device_memory_mb(live.resolution.device),
        "device_utilization_pct": util,
        "host_syncs_per_step": live.syncs_per_step,
        "warmup_s": live.warmup_s,
        "mean_return_last_k": trainer.mean_recent_return() if trainer is not None else None,
    }
    float64_ops = live.float64_ops
    nonfinite = trainer.nonfinite_events if trainer is not None else 0
    fallback = bool(trainer is not None and trainer.compile_fallback)
    passed = live.status == "ok" and float64_ops == 0 and nonfinite == 0
    status = live.status if live.status != "ok" else ("ok" if passed else "unstable")
    stability = {"float64_ops": float64_ops, "nonfinite_events": nonfinite, "compile_fallback": fallback,
                 "passed": passed}
    if live.float64_site:
        stability["float64_first_site"] = live.float64_site
    return RunResult(
        preset=live.spec.preset, variant=live.spec.variant, algo=cfg.algo, status=status,
        started_at=live.started_at or dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        git=git_info(), machine={**machine_info(live.resolution.device), "torch_threads": live.torch_threads},
        config=to_plain_dict(cfg),
        metrics=metrics_block, stability=stability, resolution=dict(live.resolution.reasons),
        steps_completed=live.timed_steps, error=live.error,
    )
