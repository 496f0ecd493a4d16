"""Run configs -> RunResults: warm-up, interleaved timed repeats, latency, sentinel check.

Several variants measured together are interleaved repeat by repeat (the order rotated by
one each round, so each variant takes every slot in turn), so machine drift hits every
variant alike and their ratios are robust on a noisy machine.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from reference_trainers import NonFiniteError, Trainer, build_trainer
from reference_trainers.runtime import device as dev
from reference_trainers.runtime import distributed
from reference_trainers.config.schema import ConfigError, to_plain_dict
from reference_trainers.config.resolve import Resolution, optimisation_summary, resolve_config

from harness.measurement import metrics
from harness.stats import quality
from harness.measurement.checkpoints import Checkpointing
from harness.errors import UserError
from harness.measurement.gpu_monitor import GpuMonitor, gpu_metrics, open_monitor
from harness.measurement.interrupts import deferred_interrupts, raise_if_stopping
from harness.measurement.machine_state import OthersMeter, Snapshot, free_cores, retain_heap
from harness.specs.own_trainer import OwnConfig, TrainerExhausted, resolve_own
from harness.specs.presets import VariantSpec
from harness.measurement.progress import RunProgress
from harness.measurement.provenance import git_info, machine_info
from harness.results import RunResult
from harness.diagnosis.frames import SiteFinder
from harness.diagnosis.host_syncs import HostSyncFinder
from harness.measurement.sentinels import Float64Sentinel

log = logging.getLogger("rlgauge")


@dataclass
class _Segment:
    """The part of the current timed repeat done so far (kept across a checkpoint and resume)."""

    frames: int = 0
    decisions: int = 0
    updates: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0


@dataclass
class _Live:
    """Measurement state of one variant while the run goes on."""

    spec: VariantSpec
    resolution: Resolution
    trainer: Trainer | None = None
    probe: metrics.TimingProbe = field(default_factory=metrics.TimingProbe)
    compile_cache: metrics.CompileCacheMeter = field(default_factory=metrics.CompileCacheMeter)
    started_at: str = ""
    warmup_s: float = 0.0
    warmup_env_steps: int = 0
    startup_s: float = 0.0
    """Seconds from the process's start to the run's (imports, parsing): every arm waits for them."""
    warmup_done: bool = False
    env_rates: list[float] = field(default_factory=list)
    agent_rates: list[float] = field(default_factory=list)
    update_rates: list[float] = field(default_factory=list)
    cpu_per_1k: list[float] = field(default_factory=list)
    others_shares: list[float] = field(default_factory=list)
    segment: _Segment = field(default_factory=_Segment)
    timed_seconds: float = 0.0
    cpu_seconds: float = 0.0
    timed_steps: int = 0
    peak_rss_mb: float = 0.0
    latency: dict[str, float] | None = None
    syncs_per_step: float | None = None
    float64_ops: int = 0
    float64_site: str | None = None
    sentinel_skipped: str | None = None
    """Why the checked iteration did not run (a trainer that ran out after its repeats)."""
    torch_threads: int | None = None
    threads_capped_from: int | None = None
    snapshot: Snapshot | None = None
    gpu: GpuMonitor | None = None
    """NVML sampling of a CUDA run's timed segments (None elsewhere, or without pynvml)."""
    error: str | None = None
    status: str = "ok"

    _PROGRESS = ("started_at", "warmup_s", "warmup_env_steps", "warmup_done", "env_rates", "agent_rates", "update_rates",
                 "cpu_per_1k", "others_shares", "timed_seconds", "cpu_seconds", "timed_steps", "peak_rss_mb")

    def progress(self) -> dict[str, Any]:
        """The runner's part of a checkpoint: what was measured so far."""
        return {**{name: getattr(self, name) for name in self._PROGRESS}, "segment": asdict(self.segment),
                "phase_seconds": dict(self.probe.seconds)}

    def restore_progress(self, saved: dict[str, Any]) -> None:
        for name in self._PROGRESS:
            setattr(self, name, saved.get(name, getattr(self, name)))  # checkpoints from before a field existed
        self.segment = _Segment(**saved["segment"])
        self.probe.seconds.update(saved["phase_seconds"])


class _Clock:
    """Wall and CPU seconds since the last ``lap`` (lapping after a checkpoint leaves its writing out)."""

    def __init__(self, cpu: metrics.ProcessCpu | None = None) -> None:
        self.process = cpu or metrics.ProcessCpu()
        self.wall, self.cpu = time.perf_counter(), self.process.seconds()

    def lap(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), self.process.seconds()
        elapsed = (wall - self.wall, cpu - self.cpu)
        self.wall, self.cpu = wall, cpu
        return elapsed


def resolve_specs(specs: list[VariantSpec]) -> list[Resolution]:
    """Resolve every variant before anything runs, so a bad flag fails fast (a user's trainer: its device)."""
    return [resolve_own(spec.config) if isinstance(spec.config, OwnConfig) else resolve_config(spec.config)
            for spec in specs]


def _plain_config(config: Any) -> dict[str, Any]:
    return config.plain() if isinstance(config, OwnConfig) else to_plain_dict(config)


class _Run:
    """The variants of one run, measured together, and their checkpoints."""

    def __init__(self, lives: list[_Live], checkpointing: Checkpointing | None) -> None:
        self.lives, self.checkpointing = lives, checkpointing
        self.checkpoint_index = 0

    def env_steps(self) -> int:
        """Env steps of every variant together (the clock of ``--checkpoint-every``)."""
        return sum(l.trainer.env_steps for l in self.lives if l.trainer is not None)

    def checkpoint_due(self) -> bool:
        """True once the run passed another multiple of ``--checkpoint-every`` env steps."""
        ckpt = self.checkpointing
        if ckpt is None or ckpt.every is None or any(l.trainer is None for l in self.lives):
            return False
        index = ckpt.index(self.env_steps())
        if index <= self.checkpoint_index:
            return False
        self.checkpoint_index = index
        return True

    def save(self, finished: bool) -> None:
        ckpt = self.checkpointing
        if ckpt is None or any(l.trainer is None for l in self.lives):
            return
        ckpt.save(self.lives[0].spec.preset, {l.spec.variant: {"trainer": l.trainer.state_dict(),
                                                               "progress": l.progress()} for l in self.lives},
                  finished)


def rotated(items: list, round_index: int) -> list:
    """``items`` rotated left by ``round_index`` (two items: alternating order)."""
    shift = round_index % len(items) if items else 0
    return items[shift:] + items[:shift]


def run_variants(specs: list[VariantSpec], *, show_progress: bool = False,
                 say: Callable[[str], None] = print,
                 checkpointing: Checkpointing | None = None) -> tuple[list[RunResult], bool]:
    """Measure each spec (continuing ``checkpointing.resumed`` if given); returns (results, interrupted)."""
    # every arm's optimiser construction imports torch._dynamo (torch.optim's dynamo-disabled methods):
    # import it here, in the start-up every arm waits for, not in the build of whichever arm comes first
    import torch._dynamo  # noqa: F401

    startup_s = metrics.seconds_since_process_start()
    lives = [_Live(spec, res, startup_s=startup_s) for spec, res in zip(specs, resolve_specs(specs))]
    run = _Run(lives, checkpointing)
    for live in lives:
        if live.spec.build is None:
            say(f"{live.spec.variant}: {optimisation_summary(live.resolution.config)}")
        elif live.spec.config.trainer.startswith("harness.specs.peers."):  # a peer library, on the public contract
            settings = live.spec.config.settings
            say(f"{live.spec.variant}: peer trainer ({live.spec.config.trainer}), matched from the {settings['env_id']} "
                f"config; process settings: threads={settings['torch_threads'] or 'default'}")
        else:
            settings = " ".join(f"{k}={v}" for k, v in live.spec.config.settings.items()) or "(its defaults)"
            say(f"{live.spec.variant}: your trainer {live.spec.config.trainer} on {live.resolution.device}: {settings}")
    total = sum(l.resolution.config.run.warmup_steps + l.resolution.config.run.repeats * l.resolution.config.run.steps
                for l in lives)
    interrupted = False
    saved = dev.process_settings()
    _fair_threads(lives)
    retain_heap(l.resolution.config.run.heap_retention for l in lives)
    with RunProgress(total, enabled=show_progress) as progress:
        try:
            for live in lives:
                with live.compile_cache.active():
                    _warm_up(live, progress, run)
            if checkpointing is not None and checkpointing.every:
                run.checkpoint_index = checkpointing.index(run.env_steps())
            rounds = max(l.resolution.config.run.repeats for l in lives)
            for r in range(rounds):
                order = rotated(lives, r)
                for live in order:
                    if len(live.env_rates) <= r < live.resolution.config.run.repeats and live.status == "ok":
                        with live.compile_cache.active():
                            _timed_segment(live, progress, run)
            for live in lives:
                if live.status == "ok":
                    _latency_and_sentinels(live)
            run.save(finished=True)
        except KeyboardInterrupt:
            interrupted = True
            for live in lives:
                if live.status == "ok":  # a variant that had failed keeps its failure
                    live.status = "interrupted"
        finally:
            for live in lives:
                if live.trainer is not None:
                    live.trainer.close()
                if live.gpu is not None:
                    live.gpu.close()
            dev.restore_process_settings(saved)
            dev.cap_default_threads(None)
    return [_result(live) for live in lives], interrupted


def _fair_threads(lives: list[_Live]) -> None:
    """Take the machine's snapshot; under ``run.fair_threads`` cap torch's default thread count at
    the cores other processes leave free, so variants with ``torch_threads`` unset cannot spin
    against a neighbour (a quiet machine leaves the default as it is)."""
    snapshot = Snapshot.take()
    defaulted = [l for l in lives if l.resolution.config.optimizations.torch_threads is None]
    cap = free_cores(snapshot.busy_cores_before)
    capped = bool(defaulted) and all(l.resolution.config.run.fair_threads for l in defaulted) \
        and cap < dev.DEFAULT_THREADS
    dev.cap_default_threads(cap if capped else None)
    for live in lives:
        live.snapshot = snapshot
        if capped and live in defaulted:
            live.threads_capped_from = dev.DEFAULT_THREADS
            log.warning("%s %s: torch's default %d threads capped to %d: other processes keep %.1f of %d "
                        "cores busy (run.fair_threads)", live.spec.preset, live.spec.variant, dev.DEFAULT_THREADS,
                        cap, snapshot.busy_cores_before, snapshot.usable_cores)


def _busy_wait(seconds: float) -> None:
    """Burn CPU for ``seconds`` (the planted slowdown: a regression costs CPU, not idle time)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _warm_up(live: _Live, progress: RunProgress, run: _Run) -> None:
    budget = live.resolution.config.run.warmup_steps
    progress.describe(f"{live.spec.variant} warm-up")
    resumed = run.checkpointing.variant_state(live.spec.variant) if run.checkpointing else None
    clock = _Clock()
    try:
        live.trainer = (live.spec.build or build_trainer)(live.resolution, probe=live.probe)
        live.torch_threads = (getattr(live.trainer, "torch_threads", None)  # a user's trainer: what its factory left
                              or live.resolution.config.optimizations.torch_threads or dev.default_threads())
        if resumed is not None:
            live.trainer.load_state_dict(resumed["trainer"])
            live.restore_progress(resumed["progress"])
        else:
            live.started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        dev.reset_peak_memory(live.resolution.device)
        live.gpu = open_monitor(live.resolution.device)
        with deferred_interrupts():  # a signal stops the loop between two iterations
            while not live.warmup_done:
                if live.trainer.iterations and distributed.agreed_min(live.trainer.env_steps) >= budget:
                    live.warmup_done = True
                    live.warmup_env_steps = live.trainer.env_steps
                    break
                raise_if_stopping()
                done = live.trainer.iterate()
                progress.advance(done.env_steps, live.trainer.env_steps)
                if run.checkpoint_due():
                    dev.synchronize(live.resolution.device)
                    live.warmup_s += clock.lap()[0]
                    run.save(finished=False)
                    clock.lap()  # saving is not warm-up
    except (UserError, ConfigError):  # a user's trainer that breaks the contract: bad input, exit 2
        raise
    except Exception as exc:  # the trainer failed: record it, keep the other variants going
        _failed(live, exc)
    dev.synchronize(live.resolution.device)
    live.warmup_s += clock.lap()[0]


def _failed(live: _Live, exc: Exception) -> None:
    live.status = "failed"
    live.error = str(exc) if isinstance(exc, NonFiniteError) else f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    own = f" (your trainer {live.spec.config.trainer})" if isinstance(live.spec.config, OwnConfig) else ""
    log.debug("%s %s: the failure's traceback", live.spec.preset, live.spec.variant, exc_info=exc)  # --debug
    log.error("%s %s%s failed: %s", live.spec.preset, live.spec.variant, own, live.error)


def _timed_segment(live: _Live, progress: RunProgress, run: _Run) -> None:
    """One timed repeat (or the rest of one a checkpoint interrupted): ``run.steps`` env steps."""
    trainer, steps, seg = live.trainer, live.resolution.config.run.steps, live.segment
    planted = live.resolution.config.run.planted_slowdown_pct
    extra = 1.0 / (1.0 - planted / 100.0) - 1.0  # iteration time x (1 + extra): rate x (1 - pct/100)
    progress.describe(live.spec.variant)
    live.probe.enabled = True
    cpu = metrics.ProcessCpu()
    others = OthersMeter(cpu.seconds)
    others.start()
    if live.gpu is not None:
        live.gpu.start()
    clock = _Clock(cpu)

    def account() -> None:
        wall, cpu = clock.lap()
        seg.seconds += wall
        seg.cpu_seconds += cpu

    try:
        with deferred_interrupts():  # a signal stops the loop between two iterations
            while distributed.agreed_min(seg.frames) < steps:
                raise_if_stopping()
                started = time.perf_counter()
                done = trainer.iterate()
                if extra:
                    _busy_wait(extra * (time.perf_counter() - started))
                seg.frames += done.env_steps
                seg.decisions += done.agent_steps
                seg.updates += done.updates
                live.peak_rss_mb = max(live.peak_rss_mb, metrics.host_rss_mb())
                progress.advance(done.env_steps, trainer.env_steps)
                if run.checkpoint_due():
                    dev.synchronize(live.resolution.device)
                    account()
                    live.probe.enabled = False
                    run.save(finished=False)
                    clock.lap()  # saving is not timed
                    live.probe.enabled = True
        dev.synchronize(live.resolution.device)
    except (UserError, ConfigError):
        raise
    except Exception as exc:
        _failed(live, exc)
        return
    finally:
        live.probe.enabled = False
        account()
        if live.gpu is not None:
            live.gpu.stop()
        live.timed_seconds += seg.seconds
        live.cpu_seconds += seg.cpu_seconds
        live.timed_steps += seg.frames
    live.env_rates.append(seg.frames / seg.seconds)
    live.agent_rates.append(seg.decisions / seg.seconds)
    live.update_rates.append(seg.updates / seg.seconds)
    live.cpu_per_1k.append(1000.0 * seg.cpu_seconds / seg.frames)
    live.others_shares.append(others.share())
    live.segment = _Segment()


def _latency_and_sentinels(live: _Live) -> None:
    """Inference latency of one batched action selection, then one checked iteration."""
    trainer, device = live.trainer, live.resolution.device
    trainer.activate()
    if getattr(trainer, "measures_latency", True):  # a user's trainer has no select_actions to time
        obs = np.array(trainer.next_obs, copy=True)
        seconds = []
        for _ in range(live.resolution.config.run.latency_samples):
            start = time.perf_counter()
            trainer.select_actions(obs)
            dev.synchronize(device)
            seconds.append(time.perf_counter() - start)
        live.latency = metrics.latency_percentiles(seconds)

    try:
        checks = run_checks(trainer, device, live.resolution.config.env.num_envs,
                            own=isinstance(live.spec.config, OwnConfig))
    except TrainerExhausted as exc:  # every timed repeat completed: not a failure of that work
        live.sentinel_skipped = (f"{exc}, after its timed repeats: the checked iteration (float64, host syncs) was "
                                 "skipped; give it one iteration more to have it checked")
        log.warning("%s %s: %s", live.spec.preset, live.spec.variant, live.sentinel_skipped)
        return
    except (UserError, ConfigError):
        raise
    except Exception as exc:
        _failed(live, exc)
        return
    live.syncs_per_step = checks.host_syncs_per_step
    live.float64_ops, live.float64_site = checks.float64_ops, checks.float64_site


@dataclass(frozen=True)
class Checks:
    """What the checked iteration found: float64 ops (and the first one's site), host syncs per vector step."""

    float64_ops: int
    float64_site: str | None
    host_syncs_per_step: float


def run_checks(trainer: Any, device: Any, num_envs: int, *, own: bool) -> Checks:
    """The checked iteration ``rlgauge run`` runs (``rlgauge try``'s arms too): one call, or a user's trainer's
    calls until ``CHECKED_ENV_STEPS`` env steps, with float64 ops and host syncs counted (diagnose's sync counter:
    the same calls counted the same way, an optimizer's own step counters too). Compiled functions run their eager
    code for it (a dispatch mode cannot run inside compiled code), without counting as a compile fallback."""
    syncs, wide = HostSyncFinder(device, SiteFinder()), Float64Sentinel()
    with torch.compiler.set_stance("force_eager"), syncs, wide:
        agent_steps = _checked_iterations(trainer, own)
    vector_steps = max(1, agent_steps // num_envs)
    return Checks(wide.count, wide.first_site, syncs.count / vector_steps)


CHECKED_ENV_STEPS = 512
"""A user's trainer is checked over whole calls of at least this many env steps, as ``diagnose`` audits it: a
generator that yields every env step and updates every 10th has its updates' syncs counted at their rate."""


def _checked_iterations(trainer: Any, own: bool) -> int:
    """The checked iteration: one call (rlgauge's trainers), or a user's trainer's calls until
    ``CHECKED_ENV_STEPS`` env steps; returns the agent steps taken. A trainer that runs out after
    its first call keeps what was checked."""
    agent_steps = trainer.iterate().agent_steps
    env_steps = agent_steps
    while own and env_steps < CHECKED_ENV_STEPS:
        try:
            done = trainer.iterate()
        except TrainerExhausted:
            break
        agent_steps += done.agent_steps
        env_steps += done.env_steps
    return agent_steps


def _end_to_end(live: _Live, measured: bool) -> dict[str, float | None]:
    """What a user who runs this arm alone waits: the process's start-up, the trainer's construction
    and warm-up (compilation included) and the timed training; and env steps over that whole time."""
    if not measured:
        return {"end_to_end_s": None, "end_to_end_env_steps_per_sec": None}
    seconds = live.startup_s + live.warmup_s + live.timed_seconds
    steps = live.warmup_env_steps + live.timed_steps
    return {"end_to_end_s": seconds, "end_to_end_env_steps_per_sec": steps / seconds if seconds > 0 else None}


def _summed_over_ranks(per_rank: list[list[float]]) -> list[float]:
    """Per-repeat rates of every rank added up (unchanged in a single process)."""
    return [float(sum(values)) for values in zip(*per_rank)]


def _result(live: _Live) -> RunResult:
    """The run's result; under torchrun env and agent steps/sec are summed over the ranks, every
    other metric is this rank's (updates are synchronised: each rank takes the same optimiser steps)."""
    cfg, trainer = live.resolution.config, live.trainer
    env_rates_by_rank = distributed.gather(list(live.env_rates))  # every rank takes part
    rates = _summed_over_ranks(env_rates_by_rank)
    live.agent_rates = _summed_over_ranks(distributed.gather(list(live.agent_rates)))
    live.timed_steps = sum(distributed.gather(live.timed_steps))
    measured = bool(rates)
    util = None
    gpu = gpu_metrics(live.gpu)
    if measured and live.resolution.device.type == "cpu" and live.timed_seconds > 0:
        util = 100.0 * live.cpu_seconds / live.timed_seconds
    elif measured and live.resolution.device.type == "cuda":
        util = gpu["gpu_utilization_pct"]  # NVML's, as on CUDA device_utilization_pct means the GPU's
    metrics_block = {
        "env_steps_per_sec": metrics.spread(rates) if measured else None,
        "agent_steps_per_sec": metrics.spread(live.agent_rates) if measured else None,
        # a result's rates are positive: none where a timed repeat took no update (a trainer without torch.optim)
        "updates_per_sec": metrics.spread(live.update_rates) if measured and min(live.update_rates) > 0 else None,
        "cpu_seconds_per_1k_env_steps": metrics.spread(live.cpu_per_1k) if live.cpu_per_1k else None,
        "inference_latency_ms": live.latency,
        "phase_seconds": live.probe.totals(),
        "peak_host_rss_mb": live.peak_rss_mb or metrics.host_rss_mb(),
        "peak_device_mem_mb": dev.peak_device_memory_mb(live.resolution.device),
        "device_utilization_pct": util,
        **gpu,
        "host_syncs_per_step": live.syncs_per_step,
        "warmup_s": live.warmup_s,
        **_end_to_end(live, measured),
        "inductor_cache": live.compile_cache.summary(),
        "mean_return_last_k": trainer.mean_recent_return() if trainer is not None else None,
    }
    if len(env_rates_by_rank) > 1 and measured:
        metrics_block["env_steps_per_sec_by_rank"] = [metrics.spread(r) for r in env_rates_by_rank]
    float64_ops = live.float64_ops
    nonfinite = trainer.nonfinite_events if trainer is not None else 0
    fallback = bool(trainer is not None and trainer.compile_fallback)
    passed = live.status == "ok" and float64_ops == 0 and nonfinite == 0
    status = live.status if live.status != "ok" else ("ok" if passed else "unstable")
    stability = {"float64_ops": float64_ops, "nonfinite_events": nonfinite, "compile_fallback": fallback,
                 "passed": passed}
    if live.float64_site:
        stability["float64_first_site"] = live.float64_site
    if live.sentinel_skipped:
        stability["sentinel_skipped"] = live.sentinel_skipped
    if trainer is not None and getattr(trainer, "torch_threads", None):  # a user's trainer may set them in iterate()
        live.torch_threads = trainer.torch_threads
    state = (live.snapshot or Snapshot.take()).record(live.others_shares, {
        "intra_op": live.torch_threads, "inter_op": torch.get_num_interop_threads(),
        "capped_from": live.threads_capped_from})
    return RunResult(
        preset=live.spec.preset, variant=live.spec.variant, algo=cfg.algo, status=status,
        started_at=live.started_at or dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        git=git_info(Path.cwd()) if isinstance(cfg, OwnConfig) else git_info(), machine={**machine_info(live.resolution.device), "torch_threads": live.torch_threads,
                                  "world_size": distributed.world_size()},
        config=_plain_config(cfg),
        metrics=metrics_block, stability=stability, resolution=dict(live.resolution.reasons),
        steps_completed=live.timed_steps, error=live.error,
        machine_state=state, quality=quality.assess(state, live.env_rates) if measured else None,
    )
