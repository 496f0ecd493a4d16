"""``rlgauge learn``: learning curves of both variants (and a peer) over seeds, and whether they learn alike.

Each seed builds every arm (our baseline and optimized variants, and with ``--peer`` the peer
library's trainer, matched from the baseline's config as ``run --peer`` matches it) and runs
them interleaved: one ``iterate()`` each in turn, the order rotated by one each seed, until
every arm took ``--steps`` env steps. After each iteration it records ``(env steps, mean return
of the last run.return_window episodes)``. The curves are resampled onto a common grid of env
steps (a step function: the last value at or before each point), summarised per arm by the
median and interquartile band over seeds, and compared pairwise:

- final return: the mean of a seed's curve over the last ``FINAL_FRACTION`` of the grid;
- area under the curve: the mean of a seed's curve over the whole grid;

each as the difference of the two arms' means over seeds (first arm minus second) with a
percentile bootstrap interval that resamples each arm's seeds on its own (two arms' runs are
independent, whatever their seed numbers). Only grid points where every compared curve has a
value count (a curve has none before its first finished episode). "same learning": the
interval holds 0 or lies above it; "learns less": it lies wholly below 0. Only seeds every
arm of a comparison finished take part in its verdicts, and as everywhere in rlgauge
(``power.py``) a verdict needs ``power.MIN_REPEATS`` of them per arm: two seeds get an
interval but no verdict.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import time
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reference_trainers.config.schema import ConfigError, TrainConfig, to_plain_dict
from reference_trainers.config.flags import budget_overrides

from harness.stats import power
from harness.stats import quality
from harness.errors import UserError
from harness.measurement.interrupts import raise_if_stopping
from harness.measurement.machine_state import OthersMeter, Snapshot, free_cores, retain_heap
from harness.specs.presets import VariantSpec, specs_for
from harness.measurement.progress import RunProgress

log = logging.getLogger("rlgauge")

DEFAULT_STEPS = 100_000
"""Env steps each arm trains for, per seed."""
DEFAULT_SEEDS = 5
MIN_SEEDS = 2
"""Fewest seeds ``learn`` takes (an interval needs two); a verdict needs ``power.MIN_REPEATS``."""
GRID_POINTS = 50
FINAL_FRACTION = 0.1
"""Share of the grid (its end) averaged into the final return."""
CONFIDENCE = 0.95
RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
"""The bootstrap's RNG seed: the same curves always give the same intervals."""
SAME, LESS = "same learning", "learns less"
METRICS = {"final_return": "final return", "auc": "area under curve"}
FILES = ("learn.json", "learn.md", "learn.png")


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
    preset: str
    seeds: list[int]
    steps: int
    arms: list[Arm]
    min_steps: int
    peer: str | None
    overrides: list[str]


def plan_learning(target: str, overrides: list[str], *, peer: str | None, seeds: int, steps: int,
                  first_seed: int = 1) -> Plan:
    """Every arm's config for every seed, resolved and checked; ``UserError`` for bad input."""
    from harness.measurement.runner import resolve_specs

    if seeds < MIN_SEEDS:
        raise UserError(f"--seeds {seeds}: learn needs at least {MIN_SEEDS} seeds for an interval over seeds; "
                        f"accepted: --seeds {MIN_SEEDS} or more (default {DEFAULT_SEEDS})")
    peer_module = _load_peer(peer)  # an unknown peer or a missing library fails first
    seed_list = list(range(first_seed, first_seed + seeds))
    budget = budget_overrides(steps)  # what budget-aware auto rules read
    by_seed = [specs_for(target, "both", [*overrides, *budget, f"seed={seed}"]) for seed in seed_list]
    names = [spec.variant for spec in by_seed[0]]
    if names != ["baseline", "optimized"] or not all(isinstance(s.config, TrainConfig) for s in by_seed[0]):
        raise UserError(f"learn {target}: needs a preset (or config file) of rlgauge's trainers with baseline and "
                        f"optimized variants; it has {', '.join(names)}")
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


def min_steps(config: TrainConfig) -> tuple[int, str]:
    """The smallest ``--steps``: one iteration, and enough for every sub-env to end an episode (a bounded env)."""
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
class Record:
    curves: dict[str, list[Curve]]
    interrupted: bool = False
    started_at: str = ""
    machine_state: dict[str, Any] = field(default_factory=dict)
    quality: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Live:
    curve: Curve
    trainer: Any = None
    done: bool = False


def run_learning(plan: Plan, *, show_progress: bool = False) -> Record:
    """Train every arm for every seed (Ctrl-C: stop, ``interrupted``; what was recorded is kept)."""
    from reference_trainers.runtime import device as dev

    record = Record({arm.name: [] for arm in plan.arms},
                    started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    saved = dev.process_settings()
    snapshot: Snapshot | None = None
    shares: list[float] = []
    threads: dict[str, int] = {}
    try:
        snapshot = _fair_threads(plan)
        retain_heap(arm.resolutions[0].config.run.heap_retention for arm in plan.arms)
        with RunProgress(plan.steps * len(plan.seeds) * len(plan.arms), enabled=show_progress) as progress:
            for index, seed in enumerate(plan.seeds):
                progress.describe(f"seed {seed} ({index + 1}/{len(plan.seeds)})")
                meter = OthersMeter()
                meter.start()
                try:
                    _run_seed(plan, index, record, progress, threads)
                finally:
                    shares.append(meter.share())
    except KeyboardInterrupt:
        record.interrupted = True
    finally:
        dev.restore_process_settings(saved)
        dev.cap_default_threads(None)
    record.machine_state = (snapshot or Snapshot.take()).record(
        shares, {"intra_op": max(threads.values(), default=None), "by_arm": threads})
    record.quality = quality.assess(record.machine_state, [])
    return record


def _fair_threads(plan: Plan) -> Snapshot:
    """The machine's snapshot; under ``run.fair_threads`` torch's default threads capped at the free cores."""
    from reference_trainers.runtime import device as dev

    snapshot = Snapshot.take()
    cap = free_cores(snapshot.busy_cores_before)
    if cap < dev.DEFAULT_THREADS and all(arm.resolutions[0].config.run.fair_threads for arm in plan.arms):
        dev.cap_default_threads(cap)
        log.warning("torch's default %d threads capped to %d: other processes keep %.1f of %d cores busy "
                    "(run.fair_threads)", dev.DEFAULT_THREADS, cap, snapshot.busy_cores_before, snapshot.usable_cores)
    return snapshot


def _run_seed(plan: Plan, index: int, record: Record, progress: RunProgress, threads: dict[str, int]) -> None:
    """Build each arm for seed ``index`` and iterate them round-robin until each has ``plan.steps``."""
    from reference_trainers import build_trainer
    from reference_trainers.runtime import device as dev

    from harness.measurement.runner import rotated

    lives: list[_Live] = []
    try:
        for arm in rotated(plan.arms, index):
            live = _Live(Curve(arm.name, plan.seeds[index]))
            record.curves[arm.name].append(live.curve)
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
            live.curve.build_s = time.perf_counter() - started
            threads[arm.name] = (getattr(live.trainer, "torch_threads", None)
                                 or resolution.config.optimizations.torch_threads or dev.default_threads())
        while not all(live.done for live in lives):
            for live in lives:
                if not live.done:
                    _step(live, plan.steps, progress)
    finally:
        for live in lives:
            if live.trainer is not None:
                live.trainer.close()


def _step(live: _Live, steps: int, progress: RunProgress) -> None:
    """One ``iterate()`` of one arm, timed, and its point on the curve."""
    trainer, curve = live.trainer, live.curve
    trainer.activate()
    raise_if_stopping()
    started = time.perf_counter()
    try:
        done = trainer.iterate()
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
    progress.advance(done.env_steps, progress.completed + done.env_steps)


def _failed(live: _Live, exc: Exception) -> None:
    live.done = True
    live.curve.error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    log.debug("%s seed %d: the failure's traceback", live.curve.arm, live.curve.seed, exc_info=exc)
    log.error("%s seed %d failed: %s", live.curve.arm, live.curve.seed, live.curve.error)


# --------------------------------------------------------------------------- curves on a grid, intervals, verdicts

def make_grid(steps: int, points: int = GRID_POINTS) -> list[int]:
    """``points`` env-step counts evenly spaced up to ``steps`` (fewer when ``steps`` is smaller)."""
    return sorted({round(steps * (i + 1) / points) for i in range(points)} - {0})


def on_grid(points: Sequence[tuple[int, float | None]], grid: Sequence[int]) -> list[float | None]:
    """A curve as a step function at each grid point: the last value recorded at or before it; None before
    the first record, while it is None (no episode finished yet), and past the curve's last record."""
    steps = [s for s, _ in points]
    values: list[float | None] = []
    for at in grid:
        i = bisect_right(steps, at) - 1
        values.append(None if i < 0 or at > steps[-1] else points[i][1])
    return values


def aggregate(rows: Sequence[Sequence[float | None]]) -> dict[str, list[Any]]:
    """Median and 25/75 % per grid point over the rows that have a value there (``n`` of them)."""
    table = np.array(rows, dtype=np.float64).reshape(len(rows), -1)
    out: dict[str, list[Any]] = {"median": [], "q25": [], "q75": [], "n": []}
    for column in table.T:
        values = column[np.isfinite(column)]
        out["n"].append(int(values.size))
        low, mid, high = np.percentile(values, [25, 50, 75]) if values.size else (None, None, None)
        for key, value in (("q25", low), ("median", mid), ("q75", high)):
            out[key].append(None if value is None else float(value))
    return out


@dataclass(frozen=True)
class Difference:
    """``mean(first) - mean(second)`` over seeds with its percentile bootstrap interval."""

    value: float
    low: float
    high: float
    first_mean: float
    second_mean: float
    n_first: int
    n_second: int


def bootstrap_difference(first: Sequence[float], second: Sequence[float], *, confidence: float = CONFIDENCE,
                         resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Difference:
    """Unpaired percentile bootstrap: each side's seeds resampled with replacement on their own."""
    a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("need at least one value on each side")
    rng = np.random.default_rng(seed)
    means_a = a[rng.integers(0, a.size, size=(resamples, a.size))].mean(axis=1)
    means_b = b[rng.integers(0, b.size, size=(resamples, b.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means_a - means_b, [tail, 1.0 - tail])
    return Difference(float(a.mean() - b.mean()), float(low), float(high), float(a.mean()), float(b.mean()),
                      int(a.size), int(b.size))


def verdict(difference: Difference) -> str:
    """``LESS`` when the whole interval lies below 0, else ``SAME`` (it holds 0 or favours the first arm)."""
    return LESS if difference.high < 0 else SAME


def no_verdict(seeds: int) -> str:
    """The verdict with too few seeds: a bootstrap of two seeds only spans the pairs' differences."""
    return f"no verdict: {seeds} seeds (needs {power.MIN_REPEATS})"


def final_count(points: int) -> int:
    """Grid points at the end averaged into the final return."""
    return max(1, round(FINAL_FRACTION * points))


def compare(first: str, second: str, rows_first: Sequence[Sequence[float | None]],
            rows_second: Sequence[Sequence[float | None]], grid_size: int) -> list[dict[str, Any]]:
    """Final return and area under the curve of ``first`` against ``second`` (rows: complete seeds' grid values)."""
    a = np.array(rows_first, dtype=np.float64).reshape(len(rows_first), grid_size)
    b = np.array(rows_second, dtype=np.float64).reshape(len(rows_second), grid_size)
    support = np.isfinite(a).all(axis=0) & np.isfinite(b).all(axis=0)
    tail = np.zeros(grid_size, dtype=bool)
    tail[grid_size - final_count(grid_size):] = True
    out = []
    for metric, columns in (("final_return", support & tail), ("auc", support)):
        row: dict[str, Any] = {"first": first, "second": second, "metric": metric,
                               "seeds": [len(rows_first), len(rows_second)], "grid_points": int(columns.sum())}
        if min(len(rows_first), len(rows_second)) < MIN_SEEDS:
            row["verdict"] = f"no verdict: fewer than {MIN_SEEDS} complete seeds"
        elif not columns.any():
            row["verdict"] = "no verdict: no grid point where every curve has a value"
        else:
            diff = bootstrap_difference(a[:, columns].mean(axis=1), b[:, columns].mean(axis=1))
            fewest = min(diff.n_first, diff.n_second)
            row.update(difference=diff.value, low=diff.low, high=diff.high, first_mean=diff.first_mean,
                       second_mean=diff.second_mean,
                       verdict=verdict(diff) if power.has_power(fewest) else no_verdict(fewest))
        out.append(row)
    return out


def comparisons(peer: str | None) -> list[tuple[str, str]]:
    """Each variant against the peer, then optimized against baseline."""
    pairs = [("optimized", peer), ("baseline", peer)] if peer is not None else []
    return [*pairs, ("optimized", "baseline")]


# --------------------------------------------------------------------------- the summary and its files

def summary(plan: Plan, record: Record) -> dict[str, Any]:
    """``learn.json``: settings, arms, the grid, per-seed curves, aggregates, verdicts, machine state."""
    from harness.measurement.provenance import git_info, machine_info

    grid = make_grid(plan.steps)
    curves, aggregates, complete = {}, {}, {}
    for arm in plan.arms:
        entries = []
        for curve in record.curves[arm.name]:
            entries.append({"seed": curve.seed, "complete": curve.complete(plan.steps), "env_steps": curve.env_steps,
                            "wall_s": round(curve.wall_s, 3), "build_s": round(curve.build_s, 3), "error": curve.error,
                            "on_grid": on_grid(curve.points, grid) if curve.points else [None] * len(grid),
                            "points": [[s, r] for s, r in curve.points]})
        curves[arm.name] = entries
        aggregates[arm.name] = aggregate([e["on_grid"] for e in entries]) if entries else None
        complete[arm.name] = [e["on_grid"] for e in entries if e["complete"]]
    verdicts = [row for first, second in comparisons(plan.peer)
                for row in compare(first, second, complete[first], complete[second], len(grid))]
    first = plan.arms[0].resolutions[0]
    return {
        "preset": plan.preset, "interrupted": record.interrupted, "started_at": record.started_at,
        "settings": {"steps": plan.steps, "seeds": plan.seeds, "peer": plan.peer, "overrides": plan.overrides,
                     "min_steps": plan.min_steps, "grid_points": len(grid), "final_fraction": FINAL_FRACTION,
                     "confidence": CONFIDENCE, "resamples": RESAMPLES, "bootstrap_seed": BOOTSTRAP_SEED,
                     "bootstrap": "unpaired percentile: each arm's seeds resampled on their own",
                     "return_window": first.config.run.return_window, "device": str(first.device)},
        "arms": [_arm_entry(arm, record) for arm in plan.arms],
        "grid": grid, "curves": curves, "aggregates": aggregates, "verdicts": verdicts,
        "git": git_info(), "machine": machine_info(first.device),
        "machine_state": record.machine_state, "quality": record.quality,
    }


def _arm_entry(arm: Arm, record: Record) -> dict[str, Any]:
    config = arm.resolutions[0].config
    plain = config.plain() if arm.kind == "peer" else to_plain_dict(config)
    wall = sum(c.wall_s for c in record.curves[arm.name])
    steps = sum(c.env_steps for c in record.curves[arm.name])
    return {"name": arm.name, "kind": arm.kind, "wall_s": round(wall, 3),
            "env_steps_per_sec": round(steps / wall, 1) if wall > 0 else None, "config": _finite(plain)}


def _finite(value: Any) -> Any:
    """JSON-safe: a non-finite float (an unbounded setting) written as its name."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:+,.1f}" if signed else f"{value:,.1f}"


def markdown(data: dict[str, Any]) -> str:
    """``learn.md``: the arms' final returns and speed, then every verdict with its interval."""
    s = data["settings"]
    level = f"{s['confidence'] * 100:g} %"
    header = (f"{len(s['seeds'])} seeds ({s['seeds'][0]}..{s['seeds'][-1]}), {s['steps']:,} env steps per arm and "
              f"seed on {s['device']}; return: mean of the last {s['return_window']} episodes; curves resampled on "
              f"{s['grid_points']} points.")
    lines = [f"# Learning: {data['preset']}" + (" (interrupted)" if data["interrupted"] else ""), "", header, "",
             "| arm | final return, median [IQR] | complete seeds | wall s | env steps/s |", "|---|---|---|---|---|"]
    for arm in data["arms"]:
        agg = data["aggregates"][arm["name"]]
        seeds = data["curves"][arm["name"]]
        final = "n/a" if agg is None or agg["median"][-1] is None else \
            f"{_fmt(agg['median'][-1])} [{_fmt(agg['q25'][-1])}-{_fmt(agg['q75'][-1])}]"
        rate = "n/a" if arm["env_steps_per_sec"] is None else f"{arm['env_steps_per_sec']:,.0f}"
        lines.append(f"| {arm['name']} | {final} | {sum(e['complete'] for e in seeds)} of {len(seeds)} | "
                     f"{arm['wall_s']:,.1f} | {rate} |")
    lines += ["", f"| comparison | metric | difference | {level} CI | verdict |", "|---|---|---|---|---|"]
    for row in data["verdicts"]:
        interval = f"[{_fmt(row['low'], True)}, {_fmt(row['high'], True)}]" if "low" in row else "n/a"
        lines.append(f"| {row['first']} vs {row['second']} | {METRICS[row['metric']]} | "
                     f"{_fmt(row.get('difference'), True)} | {interval} | {row['verdict']} |")
    legend = (f"Difference: first arm minus second, mean over seeds; {level} percentile bootstrap over seeds "
              f"({s['resamples']:,} resamples, each arm's seeds on their own). Final return: the last "
              f"{s['final_fraction'] * 100:g} % of the grid; area under curve: the mean over the grid. '{SAME}': the "
              f"interval holds 0 or lies above it (no shortfall found: its low end is the largest one the seeds "
              f"cannot rule out); '{LESS}': it lies below 0. Wall s: seconds in iterate() over every seed, "
              "compilation included.")
    lines += ["", legend]
    reasons = (data.get("quality") or {}).get("reasons") or []
    if reasons:
        lines += ["", "The wall seconds are not trustworthy (the curves, counted in env steps, are unaffected): "
                  + "; ".join(reasons) + "."]
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, data: dict[str, Any]) -> None:
    """``learn.json``, ``learn.md`` and ``learn.png`` in ``out`` (each written atomically)."""
    from reference_trainers.state.atomic_file import write_text_atomically

    from harness.report.plots import learning_chart

    write_text_atomically(out / "learn.json", json.dumps(data, indent=2) + "\n")
    write_text_atomically(out / "learn.md", markdown(data))
    series = {name: (agg["median"], agg["q25"], agg["q75"]) for name, agg in data["aggregates"].items() if agg}
    s = data["settings"]
    title = (f"{data['preset']}: median and IQR over {len(s['seeds'])} seeds"
             + (" (interrupted)" if data["interrupted"] else ""))
    learning_chart(out / "learn.png", title, data["grid"], series,
                   f"mean return of the last {s['return_window']} episodes")


def failed_verdicts(data: dict[str, Any]) -> list[str]:
    """``first vs second (metric)`` of each comparison that says "learns less"."""
    return [f"{r['first']} vs {r['second']} ({METRICS[r['metric']]})" for r in data["verdicts"] if r["verdict"] == LESS]


def failed_curves(data: dict[str, Any]) -> list[str]:
    """``arm seed N: error`` of each run that failed (logged when it failed)."""
    return [f"{arm} seed {e['seed']}: {e['error']}" for arm, entries in data["curves"].items() for e in entries
            if e["error"]]
