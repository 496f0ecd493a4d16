"""Diagnose a trainer (a preset's variant or a user's own): where its time goes and the lines that cost it.

One code path for both kinds of arm. The trainer is built as ``rlgauge run`` builds it and
driven through ``iterate()`` in three passes, none of them a timed figure of ``run``/``gate``:

1. warm-up (``run.warmup_steps``, at least one call), untimed;
2. plain and hooked, block by block in turn: ``run.steps`` env steps with no hooks (the
   overhead's reference) and ``run.steps`` with the phase hooks (``harness.diagnosis.phases``)
   and the probe on, for the split found without instrumentation beside the probe's. A block is
   one call, or, for a trainer whose calls take fewer optimizer steps than one each (a generator
   that yields every env step and updates every 10th), as many calls as one update takes, so
   both arms hold whole updates;
3. audit: whole blocks (at least ``AUDIT_ENV_STEPS`` env steps) under the host-sync, float64 and kernel-counting modes, with the phase hooks
   beside them to tell acting syncs from the rest (slow; counts only).

A trainer that raises in a pass stops the diagnosis there: what was found up to then is
reported with the error (``DiagnosisFailed``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from reference_trainers import build_trainer
from reference_trainers.config.errors import ConfigError
from reference_trainers.config.schema import to_plain_dict
from reference_trainers.runtime import device as dev
from reference_trainers.runtime.probe import PHASES

from harness.diagnosis import flag_advice
from harness.diagnosis.flag_advice import (  # noqa: F401 - the preset flag advice, also reached from here
    DIAGNOSE_DEFAULT_STEPS, Facts, advise, diagnosis, diagnosis_lines, env_ceiling, facts_from, machine_load,
    phase_shares)
from harness.diagnosis.float64_sites import float64_finder, float64_sites
from harness.diagnosis.frames import SiteFinder, raise_site, short
from harness.diagnosis.hot_lines import LineKernels, hot_summary
from harness.diagnosis.host_syncs import HostSyncFinder, cuda_sync_warnings, per_env_step
from harness.diagnosis.loop_shape import KernelCounter, compile_counters, optimizers
from harness.diagnosis.compiled import CompileLog
from harness.diagnosis.hooks import HookSet
from harness.diagnosis.phases import HOOKED_PHASES, LoopCounters, PhaseClock
from harness.diagnosis.recommendations import recommend
from harness.errors import UserError
from harness.measurement import metrics
from harness.measurement.machine_state import fair_threads_cap
from harness.specs.own_trainer import OwnConfig, TrainerExhausted
from harness.specs.presets import VariantSpec


AUDIT_ENV_STEPS = 512
"""The audit's env steps at least: a sync every 100th step (periodic logging) is seen at its rate."""


class DiagnosisFailed(Exception):
    """The trainer raised during the diagnosis; ``partial`` holds what was found up to then."""

    def __init__(self, message: str, partial: dict[str, Any]) -> None:
        super().__init__(message)
        self.partial = partial


@dataclass
class _Pass:
    """Env steps, optimizer steps and wall seconds of the ``iterate()`` calls of one pass."""

    env_steps: int = 0
    calls: int = 0
    seconds: float = 0.0
    optimizer_steps: int = 0


def calls_per_update(stepping_calls: list[int]) -> int:
    """The calls a block takes so that each holds whole updates: the median distance between the warm-up's calls
    that stepped an optimizer (a generator yielding every env step, updating every 10th: 10); 1 where fewer than
    two calls stepped one."""
    gaps = sorted(b - a for a, b in zip(stepping_calls, stepping_calls[1:]))
    return max(1, gaps[len(gaps) // 2]) if gaps else 1


@dataclass
class _State:
    clock: PhaseClock = field(default_factory=PhaseClock)
    counters: LoopCounters = field(default_factory=LoopCounters)
    probe: metrics.TimingProbe = field(default_factory=metrics.TimingProbe)
    plain: _Pass = field(default_factory=_Pass)
    hooked: _Pass = field(default_factory=_Pass)
    audit: _Pass = field(default_factory=_Pass)
    syncs: HostSyncFinder | None = None
    wide: Any = None
    kernels: KernelCounter | None = None
    compile_before: dict[str, int] = field(default_factory=dict)
    compile_after: dict[str, int] = field(default_factory=dict)
    threads: int = 0
    ran_out: bool = False
    finder: SiteFinder | None = None
    block: int = 1
    """``iterate()`` calls per block (``calls_per_update``)."""
    audit_counters: LoopCounters = field(default_factory=LoopCounters)
    log: CompileLog = field(default_factory=CompileLog)
    compile_start: dict[str, int] = field(default_factory=dict)
    compiled: bool = False
    """Frames were compiled by the end of the warm-up: the torch-side hooks stay installed throughout."""
    recompiles_before: int = 0
    recompile_reasons: list[str] = field(default_factory=list)
    compiled_calls: Any = None
    lines: Any = None
    """The audit's ``LineKernels``: kernels and op time by phase and user line."""
    """The hooks' ``CompiledCalls``: which source lines are compiled functions'."""


def _iterate(trainer: Any, into: _Pass, clock: PhaseClock | None = None, counters: LoopCounters | None = None) -> bool:
    """One ``iterate()`` call counted into ``into``; False when a generator trainer ran out."""
    if clock is not None:
        clock.start_window()
    start = time.perf_counter()
    try:
        done = trainer.iterate()
    except (StopIteration, TrainerExhausted):
        return False
    finally:
        if clock is not None:
            clock.end_window()
        if counters is not None:
            counters.resolve(None)
    into.seconds += time.perf_counter() - start
    into.env_steps += done.env_steps
    into.optimizer_steps += done.updates  # a user's trainer: its optimizer steps unless it reports its own
    into.calls += 1
    return True


def _warm_up(trainer: Any, into: _Pass, steps: int, state: _State) -> list[int]:
    """The warm-up; returns the indices of its calls that stepped an optimizer."""
    stepping = []
    while into.env_steps < steps or into.calls == 0:
        before = into.optimizer_steps
        if not _iterate(trainer, into):
            state.ran_out = True
            break
        if into.optimizer_steps > before:
            stepping.append(into.calls)
    return stepping


def _plain_and_hooked(trainer: Any, steps: int, state: _State, hook_set: HookSet) -> None:
    """``steps`` env steps without hooks and ``steps`` with them, block by block in turn (a busy
    machine slows both alike, so their ratio is the hooks' overhead). A compiled trainer keeps the
    torch-side hooks installed, idle, in its plain blocks (``hooks``: no recompile of rlgauge's making)."""
    while (state.plain.env_steps < steps or state.hooked.env_steps < steps) and not state.ran_out:
        if state.plain.env_steps <= state.hooked.env_steps:
            for _ in range(state.block):
                state.ran_out = not _iterate(trainer, state.plain)
                if state.ran_out:
                    break
            continue
        hook_set.install()
        state.clock.enabled = state.probe.enabled = True
        try:
            for _ in range(state.block):
                state.ran_out = not _iterate(trainer, state.hooked, state.clock, state.counters)
                if state.ran_out:
                    break
        finally:
            state.clock.enabled = state.probe.enabled = False
            hook_set.remove()


def _passes(trainer: Any, spec: VariantSpec, resolution: Any, state: _State, hook_set: HookSet) -> None:
    run = resolution.config.run
    warm = _Pass()
    trainer.activate()
    state.block = calls_per_update(_warm_up(trainer, warm, run.warmup_steps, state))
    if state.ran_out:
        return
    state.compiled_calls = hook_set.view.compiled
    state.compiled = compile_counters()["frames_compiled"] > state.compile_start.get("frames_compiled", 0) or \
        bool(hook_set.view.compiled.roles)
    hook_set.keep = state.compiled
    hook_set.remove()
    state.compile_before = compile_counters()
    state.recompiles_before = len(state.log.recompiles)
    state.threads = torch.get_num_threads()
    own_is_rlgauge = not isinstance(spec.config, OwnConfig)
    state.finder = hook_set.view.finder = SiteFinder(own_is_rlgauge)
    _plain_and_hooked(trainer, run.steps, state, hook_set)
    state.compile_after = compile_counters()
    state.recompile_reasons = state.log.recompiles[state.recompiles_before:]
    if state.ran_out and not state.hooked.calls:
        return
    _audit(trainer, resolution, own_is_rlgauge, state, hook_set)


def _audit(trainer: Any, resolution: Any, own_is_rlgauge: bool, state: _State, hook_set: HookSet) -> None:
    """Whole blocks under the host-sync, float64 and kernel-counting modes, the phase hooks beside them."""
    finder, audit_clock, audit_counters = state.finder, PhaseClock(), state.audit_counters
    view = hook_set.view
    view.clock, view.counters, view.finder = audit_clock, audit_counters, None
    state.syncs = HostSyncFinder(resolution.device, finder, audit_counters, audit_clock)
    state.wide, state.kernels = float64_finder(own_is_rlgauge), KernelCounter()
    state.lines = LineKernels(finder, audit_clock)
    # a dispatch mode cannot run inside compiled code: the audit runs the compiled functions' eager code
    with torch.compiler.set_stance("force_eager"), cuda_sync_warnings(resolution.device, finder, state.syncs.sites,
                                                                                   state.syncs):
        hook_set.install()
        try:
            with state.syncs, state.wide, state.kernels, state.lines:
                audit_clock.enabled = True
                try:
                    while not state.ran_out and (state.audit.env_steps < AUDIT_ENV_STEPS or not state.audit.calls):
                        for _ in range(state.block):
                            if not _iterate(trainer, state.audit, audit_clock, audit_counters):
                                state.ran_out = True
                                break
                finally:
                    audit_clock.enabled = False
        finally:
            hook_set.remove()


def _percent(seconds: dict[str, float], total: float) -> dict[str, float]:
    shares = {name: round(100.0 * seconds.get(name, 0.0) / total, 1) if total > 0 else 0.0 for name in seconds}
    shares["other"] = round(max(0.0, 100.0 - sum(shares.values())), 1)
    return shares


def _result(spec: VariantSpec, resolution: Any, target: str, state: _State) -> dict[str, Any]:
    own = isinstance(spec.config, OwnConfig)
    hooked, audit, counters = state.hooked, state.audit, state.counters
    steps = max(1, hooked.env_steps)
    seconds = {name: max(0.0, state.clock.seconds[name]) for name in HOOKED_PHASES}
    seconds["update"] += state.clock.burst_seconds()
    if counters.forwards["inference"] == 0 and counters.env_classes:  # acting with no torch module (module doc)
        handed_over, acting = state.clock.steady_split()
        seconds["transfer"] += handed_over
        seconds["inference"] += acting
    phases = _percent(seconds, hooked.seconds)
    probe_seconds = state.probe.totals()
    reported = any(probe_seconds.get(name, 0.0) > 0 for name in PHASES)
    probe = _percent({name: probe_seconds.get(name, 0.0) for name in PHASES}, hooked.seconds) if reported else None
    plain_rate = state.plain.env_steps / state.plain.seconds if state.plain.seconds else None
    hooked_rate = hooked.env_steps / hooked.seconds if hooked.seconds else None
    audit_rate = audit.env_steps / audit.seconds if audit.seconds else None
    wide = state.wide
    envs_per_step = _envs_per_step(spec, state)
    d: dict[str, Any] = {
        "kind": "trainer" if own else "preset", "target": target, "preset": spec.preset, "variant": spec.variant,
        "trainer": spec.config.trainer if own else spec.config.algo, "device": str(resolution.device),
        "env_steps": {"plain": state.plain.env_steps, "hooked": hooked.env_steps, "audit": audit.env_steps},
        "phases": phases, "probe_phases": probe,
        "host_syncs": per_env_step(state.syncs.sites, audit.env_steps, state.audit_counters.acting_syncs,
                                   envs_per_step, state.syncs.contexts,
                                   state.audit_counters.update_syncs) if state.syncs else [],
        "float64": float64_sites(wide) if wide is not None else [],
        "forwards_per_env_step": counters.forwards["inference"] / steps,
        "rows_per_inference_forward": counters.inference_rows / max(1, counters.forwards["inference"]),
        "inference_forward_sites": counters.acting_sites(),
        "graph_building_acting": counters.unused_acting_graphs(steps),
        "loop": {
            "envs_per_step": envs_per_step,
            "calls_per_block": state.block,
            "plain_optimizer_steps_per_env_step": state.plain.optimizer_steps / max(1, state.plain.env_steps),
            "update_forwards_per_env_step": counters.forwards["update"] / steps,
            "optimizer_steps_per_env_step": counters.optimizer_steps / steps,
            "kernels_per_env_step": (state.kernels.kernels / max(1, audit.env_steps)) if state.kernels else 0.0,
            "optimizers": optimizers(counters.optimizers, counters.compiled_optimizers, counters.eager_optimizers),
            "torch_threads": state.threads or torch.get_num_threads(),
            "env_classes": [name for name, _ in counters.env_classes.most_common()],
            "host_tensors_per_update": state.clock.update_host_tensors / max(1, counters.optimizer_steps),
            **_compile_facts(state),
        },
        "overhead": {"plain_env_steps_per_sec": plain_rate, "hooked_env_steps_per_sec": hooked_rate,
                     "audit_env_steps_per_sec": audit_rate,
                     "hooks_pct": 100.0 * (plain_rate / hooked_rate - 1.0) if plain_rate and hooked_rate else None},
        "ran_out": state.ran_out,
    }
    d["hot_lines"] = hot_summary(state.lines, d["phases"],
                                 max(1, state.audit_counters.optimizer_steps, state.audit.optimizer_steps))
    if state.compiled:  # the audit replays compiled functions eagerly: what it saw inside them is marked
        for row in (*d["host_syncs"], *d["float64"], *d["hot_lines"]["lines"]):
            row["eager_replay_only"] = state.compiled_calls.replayed(row["where"])
    d["warnings"] = _warnings(d)
    from harness.trials.catalogue import changes_for_rule  # the check line names the changes try makes

    d["recommendations"] = recommend(d, target, tried_by=changes_for_rule)
    if not own:
        d["flag_advice"] = _flag_advice(resolution, d, plain_rate)
    return d


def _compile_facts(state: _State) -> dict[str, Any]:
    """torch.compile as the trainer has it: its graph breaks from the build on, by kind and line (dynamo's own
    log), and the frames compiled while diagnosed (recompiles), with dynamo's reasons."""
    after, before, start = state.compile_after, state.compile_before, state.compile_start
    sites = [{"kind": kind, "where": where, "count": count} for (kind, where), count in state.log.breaks.most_common()]
    return {"graph_breaks": after.get("graph_breaks", 0) - start.get("graph_breaks", 0),
            "graph_break_sites": sites,
            "frames_compiled": after.get("frames_compiled", 0) - start.get("frames_compiled", 0),
            "recompiles": after.get("frames_compiled", 0) - before.get("frames_compiled", 0),
            "recompile_reasons": state.recompile_reasons[:10],
            "compiled_calls": dict(state.counters.compiled_calls),
            "compile_failed": dict(state.compiled_calls.failed) if state.compiled_calls else {},
            "compiled_syncs": [{"function": name, "kind": ".item()", "count": count,
                                "per_env_step": count / max(1, state.hooked.env_steps)}
                               for name, count in state.counters.compiled_syncs.most_common()],
            "hooks_kept_installed": state.compiled}


def _envs_per_step(spec: VariantSpec, state: _State) -> float:
    """Envs stepped per vector step: the config's ``num_envs`` or, where larger, the env steps per outermost
    env ``step`` call seen in the audit (a loop over single envs counts as one env each)."""
    configured = float(spec.config.env.num_envs) if getattr(spec.config, "env", None) else 1.0
    calls = state.audit_counters.env_step_calls
    measured = state.audit.env_steps / calls if calls else 1.0
    return max(configured, measured, 1.0)


def _warnings(d: dict[str, Any]) -> list[str]:
    """What makes a figure of this diagnosis unreliable, each with its fix."""
    loop, found = d["loop"], []
    for name, reason in loop.get("compile_failed", {}).items():
        found.append(f"torch.compile of {name} failed ({reason}): its eager path is what was diagnosed")
    plain, hooked = loop["plain_optimizer_steps_per_env_step"], loop["optimizer_steps_per_env_step"]
    if max(plain, hooked) > 0 and abs(plain - hooked) > 0.2 * max(plain, hooked):
        found.append(f"the calls with hooks took {hooked:.3g} optimizer steps per env step and those without "
                     f"{plain:.3g}: the phase split and the hooks' overhead are not over whole updates; make each "
                     "iterate() hold whole updates (yield after the optimizer step) or raise --steps")
    return found


def _flag_advice(resolution: Any, d: dict[str, Any], rate: float | None) -> list[dict[str, str]]:
    """rlgauge's own trainers: the flag rules over the probe's split (``flag_advice``)."""
    config = resolution.config
    shares = dict(d["probe_phases"] or {name: 0.0 for name in (*PHASES, "other")})
    vector_steps = max(1, d["env_steps"]["audit"] // max(1, config.env.num_envs))
    syncs = sum(s["count"] for s in d["host_syncs"]) / vector_steps
    ceiling = env_ceiling(config, config.run.steps)
    facts = Facts(shares=shares, syncs_per_step=syncs, utilization_pct=None,
                  ceiling_fraction=(rate / ceiling) if rate and ceiling else None, config=to_plain_dict(config),
                  compile_works=None, preset=d["preset"])
    d["env_ceiling_steps_per_sec"] = ceiling
    d["fraction_of_ceiling"] = facts.ceiling_fraction
    return flag_advice.advise(facts)


def _fair_threads(resolution: Any) -> None:
    """As ``rlgauge run`` does (``run.fair_threads``): torch's default thread count capped at the cores
    other processes leave free, so a busy machine does not make every op wait for a busy core."""
    config = resolution.config
    if getattr(getattr(config, "optimizations", None), "torch_threads", None) is None:
        cap = fair_threads_cap(config.run.fair_threads)
        if cap is not None:
            dev.cap_default_threads(cap)


def diagnose(spec: VariantSpec, resolution: Any, target: str) -> dict[str, Any]:
    """Build the variant's trainer, run the passes, return the diagnosis as plain data.

    Raises ``DiagnosisFailed`` (with the partial diagnosis) when the trainer raises, and
    ``UserError`` when a user's trainer breaks the contract (exit 2)."""
    # torch.optim imports torch._dynamo on a first step: imported now, not under the hooks and modes
    import torch._dynamo  # noqa: F401

    state = _State()
    trainer = None
    saved = dev.process_settings()
    _fair_threads(resolution)
    hook_set = HookSet(state.clock, state.counters)
    state.compile_start = compile_counters()
    try:
        state.log.install()
        hook_set.install()  # before the trainer is built: what it compiles sees the hooks as they stay
        trainer = (spec.build or build_trainer)(resolution, probe=state.probe)
        _passes(trainer, spec, resolution, state, hook_set)
    except (UserError, ConfigError):
        raise
    except Exception as exc:  # the trainer failed: report what was found up to then
        whose = f"your trainer {spec.config.trainer}" if isinstance(spec.config, OwnConfig) else \
            f"{spec.preset} {spec.variant}"
        partial = _result(spec, resolution, target, state) if state.hooked.calls else {}
        site = raise_site(exc, SiteFinder(not isinstance(spec.config, OwnConfig)))
        raise DiagnosisFailed(f"{whose} raised during the diagnosis at {short(site or '?')}: {type(exc).__name__}: "
                              f"{' '.join(str(exc).split())}", partial) from exc
    finally:
        hook_set.close()
        state.log.remove()
        if trainer is not None:
            trainer.close()
        dev.restore_process_settings(saved)
        dev.cap_default_threads(None)
    if not state.hooked.calls:
        raise UserError(f"diagnose {target}: the trainer ran out of iterations before the diagnosed ones "
                        f"(after {state.plain.env_steps:,} env steps); accepted: a trainer that iterates for "
                        "warm-up + 2 x run.steps env steps and one call more, or smaller --steps")
    return _result(spec, resolution, target, state)
