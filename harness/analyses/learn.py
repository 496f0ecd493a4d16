"""``rlgauge learn``: learning curves of a trainer's variants (and a peer) over seeds, and whether they learn alike.

Each seed is one job (``harness.campaigns``): it builds every arm (a preset's baseline and
optimized variants, a user's trainer's variants, and with ``--peer`` the peer library's trainer
matched from the baseline's config) and runs them interleaved, one ``iterate()`` each in turn,
the order rotated by one each seed, until every arm took ``--steps`` env steps. After each
iteration it records ``(env steps, mean return of the recent episodes)``. Jobs run here one after
another, or as Ray tasks (``--executor ray``): a seed's arms always share a machine.
``learn_verdicts`` turns the curves into interquartile means and verdicts with a margin,
``learn_report`` writes them. Several presets (``learn a,b``) make one campaign whose verdicts
are also aggregated over the tasks.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reference_trainers.config.schema import ConfigError, TrainConfig
from reference_trainers.config.flags import budget_overrides

from harness.campaigns.executors import Executor, LocalExecutor
from harness.campaigns.jobs import Job
from harness.errors import UserError
from harness.measurement.interrupts import raise_if_stopping
from harness.stats import quality
from harness.measurement import machine_state
from harness.measurement.machine_state import OthersMeter, Snapshot, retain_heap
from harness.specs.own_trainer import OwnConfig
from harness.specs.presets import VariantSpec, load_preset, own_trainer_preset, specs_of

log = logging.getLogger("rlgauge")

DEFAULT_STEPS = 100_000
"""Env steps each arm trains for, per seed."""
DEFAULT_SEEDS = 5
MIN_SEEDS = 2
"""Fewest seeds ``learn`` takes (an interval needs two); a verdict needs ``power.MIN_REPEATS``."""
LEARN_THREADS = 1
"""Intra-op and BLAS threads of every learn job (an arm's own ``optimizations.torch_threads`` still applies):
one count everywhere, so that a seed's curve is the same on every executor and under any load."""


# --------------------------------------------------------------------------- the plan, checked before anything runs

@dataclass
class Arm:
    """One learner: its name, ``ours`` or ``peer``, and its spec and resolution per seed."""

    name: str
    kind: str
    specs: list[VariantSpec]
    resolutions: list[Any]


@dataclass
class Plan:
    """One task of a campaign: a preset (or a user's trainer) with its arms for every seed."""

    preset: str
    seeds: list[int]
    steps: int
    arms: list[Arm]
    min_steps: int
    peer: str | None
    overrides: list[str]

    @property
    def reference(self) -> str:
        """The arm the others are compared with (``baseline`` where there is one, else the first)."""
        ours = [arm.name for arm in self.arms if arm.kind == "ours"]
        return "baseline" if "baseline" in ours else ours[0]


def split_targets(target: str) -> list[str]:
    """``a,b,c`` as three presets (a path to an existing file is one target even with a comma)."""
    if Path(target).exists():
        return [target]
    names = [name.strip() for name in target.split(",")]
    if not all(names):
        raise UserError(f"learn {target}: an empty name in the list; accepted: PRESET[,PRESET...] or FILE.yaml")
    if len(set(names)) != len(names):
        raise UserError(f"learn {target}: a preset is listed twice; accepted: distinct presets")
    return names


def plan_campaign(target: str | None, overrides: list[str], *, peer: str | None, seeds: int, steps: int,
                  first_seed: int = 1, trainer: str | None = None, config: Path | None = None) -> list[Plan]:
    """One plan per task (``a,b,c``, or ``--trainer`` with ``--config``), each checked; the tasks must have the
    same arms, so that their scores can be pooled."""
    if trainer is not None:
        if target is not None:
            raise UserError(f"learn: with --trainer, give the settings file as --config {target} (not as a "
                            "positional argument)")
        return [plan_learning(None, overrides, peer=peer, seeds=seeds, steps=steps, first_seed=first_seed,
                              trainer=trainer, config=config)]
    if config is not None:
        raise UserError("--config: only used with --trainer; a preset or config file is given as PRESET|FILE.yaml")
    if target is None:
        raise UserError("learn: the argument PRESET[,PRESET...]|FILE.yaml is required (see 'rlgauge presets'), or "
                        "--trainer MODULE:ATTRIBUTE --config FILE.yaml")
    plans = [plan_learning(name, overrides, peer=peer, seeds=seeds, steps=steps, first_seed=first_seed)
             for name in split_targets(target)]
    arms = [[arm.name for arm in plan.arms] for plan in plans]
    if any(names != arms[0] for names in arms):
        raise UserError(f"learn {target}: the tasks have different arms ({'; '.join(', '.join(a) for a in arms)}); "
                        "accepted: tasks with the same variants")
    return plans


def plan_learning(target: str | None, overrides: list[str], *, peer: str | None, seeds: int, steps: int,
                  first_seed: int = 1, trainer: str | None = None, config: Path | None = None) -> Plan:
    """Every arm's config for every seed, resolved and checked; ``UserError`` for bad input."""
    from harness.measurement.runner import resolve_specs

    if seeds < MIN_SEEDS:
        raise UserError(f"--seeds {seeds}: learn needs at least {MIN_SEEDS} seeds for an interval over seeds; "
                        f"accepted: --seeds {MIN_SEEDS} or more (default {DEFAULT_SEEDS})")
    peer_module = _load_peer(peer)  # an unknown peer or a missing library fails first
    seed_list = list(range(first_seed, first_seed + seeds))
    preset = own_trainer_preset(trainer, config) if trainer is not None else load_preset(str(target))
    own = preset.trainer is not None
    budget = [] if own else budget_overrides(steps)  # what budget-aware auto rules read
    by_seed = [specs_of(preset, "both", [*overrides, *budget, f"seed={seed}"]) for seed in seed_list]
    names = [spec.variant for spec in by_seed[0]]
    if own:
        if len(names) < 2:
            raise UserError(f"learn {preset.name}: your trainer's file has one variant ({names[0]}); learn compares "
                            "variants: accepted: a file with variants: (e.g. baseline and optimized)")
        if peer is not None:
            raise UserError("--peer: a peer is matched from a preset's config, not from your trainer's; accepted: "
                            "--peer with a preset of rlgauge's trainers")
    elif names != ["baseline", "optimized"] or not all(isinstance(s.config, TrainConfig) for s in by_seed[0]):
        raise UserError(f"learn {target}: needs a preset (or config file) of rlgauge's trainers with baseline and "
                        f"optimized variants, or a file naming your trainer:; it has {', '.join(names)}")
    arms = [Arm(name, "ours", [specs[i] for specs in by_seed], []) for i, name in enumerate(names)]
    if peer is not None:
        arms.append(Arm(peer, "peer", [_peer_spec(peer_module, peer, specs[0]) for specs in by_seed], []))
    for arm in arms:
        arm.resolutions = resolve_specs(arm.specs)
    minimum, why = min_steps(arms[0].resolutions[0].config)
    if steps < minimum:
        raise UserError(f"--steps {steps:,}: too short for learn: {why}; accepted: --steps {minimum} or more")
    return Plan(by_seed[0][0].preset, seed_list, steps, arms, minimum, peer, list(overrides))


def _load_peer(name: str | None) -> Any:
    if name is None:
        return None
    from harness.specs.peers import load_peer

    return load_peer(name)


def _peer_spec(peer: Any, name: str, baseline: VariantSpec) -> VariantSpec:
    """The peer's spec matched from the baseline's config (as ``run --peer`` builds it); its seed is the baseline's."""
    from reference_trainers.config.resolve import resolve_config

    from harness.specs.own_trainer import OwnConfig, own_builder

    resolved = resolve_config(baseline.config).config
    config = OwnConfig(peer.FACTORY, peer.peer_settings(resolved), resolved.run, resolved.device, resolved.seed)
    return VariantSpec(baseline.preset, name, config, build=own_builder(peer.FACTORY))


def iteration_steps(config: TrainConfig) -> int:
    """Env steps of one ``iterate()``: a PPO rollout, or a value trainer's ``log_interval`` decisions."""
    envs = config.env.num_envs
    if config.algo == "ppo":
        per = envs * config.ppo.num_steps
    else:
        value = config.dqn if config.algo == "dqn" else config.iqn
        per = math.ceil(value.log_interval / envs) * envs
    return per * config.env.action_repeat


def max_episode_steps(config: TrainConfig) -> int | None:
    """The env's longest episode in its own steps (``env.kwargs`` or its gymnasium registration), None if unbounded."""
    explicit = config.env.kwargs.get("max_episode_steps")
    if isinstance(explicit, int) and not isinstance(explicit, bool) and explicit > 0:
        return explicit
    import gymnasium as gym

    from reference_trainers.envs import factory as envs

    try:
        return gym.spec(config.env.id).max_episode_steps
    except Exception:  # noqa: BLE001 - an id gymnasium cannot look up (not registered yet): no known bound
        return None


def min_steps(config: TrainConfig | OwnConfig) -> tuple[int, str]:
    """The smallest ``--steps``: one iteration, and enough for every sub-env to end an episode (a bounded env);
    a user's trainer: one env step (its iterations are its own business)."""
    if isinstance(config, OwnConfig):
        return 1, "at least one env step"
    per = iteration_steps(config)
    longest = max_episode_steps(config)
    if longest is None:
        return per, f"one iteration takes {per:,} env steps"
    episode = config.env.num_envs * longest * config.env.action_repeat
    repeat = f" x action_repeat {config.env.action_repeat}" if config.env.action_repeat > 1 else ""
    why = (f"{config.env.id} episodes last up to {longest:,} steps: num_envs {config.env.num_envs} x {longest:,}{repeat} "
           f"= {episode:,} env steps before every env has ended one, and one iteration takes {per:,}")
    return max(per, episode), why


# --------------------------------------------------------------------------- running: arms interleaved, seed by seed

@dataclass
class Curve:
    """One arm's run at one seed: ``(env steps, mean recent return or None)`` after each iteration."""

    arm: str
    seed: int
    points: list[tuple[int, float | None]] = field(default_factory=list)
    env_steps: int = 0
    wall_s: float = 0.0
    """Seconds in ``iterate()`` (building the trainer excluded)."""
    build_s: float = 0.0
    error: str | None = None

    def complete(self, steps: int) -> bool:
        return self.error is None and self.env_steps >= steps


@dataclass
class SeedRun:
    """What one seed's job returns: its task, its arms' curves, the others' CPU share during it and each
    arm's torch threads."""

    task: str
    seed: int
    curves: list[Curve] = field(default_factory=list)
    others_share: float | None = None
    threads: dict[str, int] = field(default_factory=dict)
    heap_retained: bool | None = None
    """Whether the job's own process fixed glibc's malloc thresholds (None: the campaign's process did)."""


@dataclass
class Record:
    """A campaign's curves per task and arm (in seed order), and the machine it ran on."""

    curves: dict[str, dict[str, list[Curve]]]
    interrupted: bool = False
    started_at: str = ""
    executor: str = "local"
    wall_s: float = 0.0
    hosts: dict[str, str] = field(default_factory=dict)
    machine_state: dict[str, Any] = field(default_factory=dict)
    quality: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Live:
    curve: Curve
    trainer: Any = None
    done: bool = False


def seed_jobs(plans: list[Plan], sinks: dict[str, SeedRun] | None = None, own_process: bool = True) -> list[Job]:
    """One job per task and seed. ``sinks``: live records the jobs fill as they go, kept when the campaign is
    interrupted (in this process, or sent back by a fresh one); ``own_process``: each job is a process of its
    own and fixes its heap itself."""
    jobs = []
    for plan in plans:
        for index, seed in enumerate(plan.seeds):
            name = f"{plan.preset} seed {seed}"
            sink = None if sinks is None else sinks.setdefault(name, SeedRun(plan.preset, seed))
            jobs.append(Job(name, learn_seed, (plan, index, sink, own_process), keeps=2))
    return jobs


def learn_seed(plan: Plan, index: int, sink: SeedRun | None = None, own_process: bool = True) -> SeedRun:
    """One job: every arm of ``plan`` at its ``index``-th seed, interleaved (``sink``: filled as it goes;
    ``own_process``: fix the heap thresholds here, as the campaign does once for local jobs)."""
    from reference_trainers.runtime import device as dev

    from threadpoolctl import threadpool_limits

    run = sink if sink is not None else SeedRun(plan.preset, plan.seeds[index])
    saved = dev.process_settings()
    meter = OthersMeter()
    meter.start()
    try:
        if own_process:
            _retain_heap([plan])
            run.heap_retained = machine_state.heap_retention.retained
        # the curves must not depend on where or beside what the job runs: every thread count that decides how
        # float sums are split (torch's default intra-op threads, NumPy's BLAS, OpenMP) is LEARN_THREADS in
        # every job, on every executor, whatever the load; an arm's own torch_threads still applies
        dev.cap_default_threads(LEARN_THREADS)
        with threadpool_limits(limits=LEARN_THREADS):
            _run_seed(plan, index, run)
    finally:
        dev.cap_default_threads(None)
        run.others_share = meter.share()
        dev.restore_process_settings(saved)
    return run


def run_campaign(plans: list[Plan], executor: Executor, *, cpus_per_job: int = 1,
                 on_seed: Any = None) -> Record:
    """Every seed of every task through ``executor``; Ctrl-C: stop, ``interrupted``, what was recorded kept
    (a local campaign also keeps the seed it was in)."""
    record = Record({plan.preset: {arm.name: [] for arm in plan.arms} for plan in plans},
                    started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    executor=getattr(executor, "label", executor.name))
    local = isinstance(executor, LocalExecutor)
    in_process = local and not getattr(executor, "fresh_processes", False)
    sinks: dict[str, SeedRun] = {}
    jobs = seed_jobs(plans, sinks if local else None, own_process=not in_process)
    started = time.perf_counter()
    snapshot = Snapshot.take()  # learn never caps threads by the load (see learn_seed)
    if in_process:
        _retain_heap(plans)
    gathered = executor.run(jobs, cpus_per_job=cpus_per_job, on_result=on_seed)
    record.wall_s = time.perf_counter() - started
    record.interrupted, record.hosts = gathered.interrupted, dict(gathered.hosts)
    runs = [sinks[job.name] for job in jobs if job.name in sinks] if in_process else gathered.in_order(jobs)
    for run in runs:
        for curve in run.curves:
            record.curves[run.task][curve.arm].append(curve)
    threads: dict[str, int] = {}
    for run in runs:
        threads.update(run.threads)
    shares = [run.others_share for run in runs if run.others_share is not None]
    record.machine_state = snapshot.record(shares, {"intra_op": max(threads.values(), default=None),
                                                    "by_arm": threads})
    if not in_process and runs:  # each job fixed its own process's heap
        record.machine_state["heap_retained"] = all(run.heap_retained for run in runs)
    record.quality = quality.assess(record.machine_state, [])
    return record


def _retain_heap(plans: list[Plan]) -> None:
    """Under every arm's ``run.heap_retention``, glibc's malloc thresholds fixed before the arms are built."""
    retain_heap(arm.resolutions[0].config.run.heap_retention for plan in plans for arm in plan.arms)


def _run_seed(plan: Plan, index: int, run: SeedRun) -> None:
    """Build each arm for seed ``index`` and iterate them round-robin until each has ``plan.steps``."""
    from reference_trainers import build_trainer
    from reference_trainers.runtime import device as dev

    from harness.measurement.runner import rotated

    lives: list[_Live] = []
    try:
        for arm in rotated(plan.arms, index):
            live = _Live(Curve(arm.name, plan.seeds[index]))
            run.curves.append(live.curve)
            lives.append(live)
            spec, resolution = arm.specs[index], arm.resolutions[index]
            started = time.perf_counter()
            try:
                live.trainer = (spec.build or build_trainer)(resolution, probe=None)
            except (UserError, ConfigError):
                raise
            except Exception as exc:  # noqa: BLE001 - the trainer failed: record it, keep the other arms going
                _failed(live, exc)
                continue
            _check_returns(live.trainer, spec)
            live.curve.build_s = time.perf_counter() - started
            run.threads[arm.name] = (getattr(live.trainer, "torch_threads", None)
                                     or resolution.config.optimizations.torch_threads or dev.default_threads())
        while not all(live.done for live in lives):
            for live in lives:
                if not live.done:
                    _step(live, plan.steps)
    finally:
        for live in lives:
            if live.trainer is not None:
                live.trainer.close()


def _check_returns(trainer: Any, spec: VariantSpec) -> None:
    """``UserError`` for a user's trainer without ``mean_recent_return()``: learn has nothing to compare."""
    inner = getattr(trainer, "inner", trainer)
    if not callable(getattr(inner, "mean_recent_return", None)):
        raise UserError(f"learn: the trainer {getattr(spec.config, 'trainer', spec.preset)} ({spec.variant}) has no "
                        "mean_recent_return(); learn reads returns from it: accepted: a trainer with "
                        "mean_recent_return() -> float | None (docs/own-trainer.md)")


def _step(live: _Live, steps: int) -> None:
    """One ``iterate()`` of one arm, timed, and its point on the curve."""
    trainer, curve = live.trainer, live.curve
    trainer.activate()
    raise_if_stopping()
    started = time.perf_counter()
    try:
        trainer.iterate()
    except (UserError, ConfigError):
        raise
    except Exception as exc:  # noqa: BLE001 - as above
        _failed(live, exc)
        return
    finally:
        curve.wall_s += time.perf_counter() - started
    curve.env_steps = int(trainer.env_steps)
    recent = trainer.mean_recent_return()
    curve.points.append((curve.env_steps, None if recent is None else float(recent)))
    live.done = curve.env_steps >= steps


def _failed(live: _Live, exc: Exception) -> None:
    live.done = True
    live.curve.error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    log.debug("%s seed %d: the failure's traceback", live.curve.arm, live.curve.seed, exc_info=exc)
    log.error("%s seed %d failed: %s", live.curve.arm, live.curve.seed, live.curve.error)
