"""Host memory growth of long runs: a leak check per preset and variant.

``measure_rss_growth(preset, variant, steps=...)`` builds the variant's trainer, runs a
warm-up long enough to fill everything that legitimately grows (allocator pools, compiled
code and, for DQN/IQN, the replay buffer up to its capacity), then samples the process's
resident set size (RSS) at even intervals over ``steps`` more env steps, each sample taken after a
garbage collection and (on glibc) ``malloc_trim``, so that it counts memory in use rather than
what the allocator keeps cached; each point is the lowest reading after any iteration since the
previous point, so a transient (a batch in flight at one reading) is not read as growth, while a
leak raises every reading. Growth is the
least-squares slope of RSS against env steps, per 100k env steps, as a percentage of the
RSS when the measured window began; a steady leak shows as a slope, allocator noise does
not. ``python -m harness.analyses.rss_growth`` prints one row per preset and variant, each measured in
a fresh process.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import multiprocessing
from dataclasses import asdict, dataclass
from typing import Callable
import numpy as np

from reference_trainers import build_trainer
from reference_trainers.runtime import device as dev
from reference_trainers.config.resolve import VALUE_BASED, resolve_config

from harness.measurement import metrics
from harness.specs.presets import VARIANTS, preset_names, specs_for

PER_STEPS = 100_000
LIMIT_PCT = 5.0
"""The target: less than this much RSS growth per 100k env steps after warm-up."""


@dataclass(frozen=True)
class RssGrowth:
    """One preset variant: RSS along the measured window and its growth per 100k env steps."""

    preset: str
    variant: str
    warmup_steps: int
    steps: int
    rss_start_mb: float
    rss_end_mb: float
    growth_mb_per_100k: float
    growth_pct_per_100k: float
    samples: list[tuple[int, float]]

    @property
    def passed(self) -> bool:
        return self.growth_pct_per_100k < LIMIT_PCT


def leak_free_warmup(config) -> int:  # noqa: ANN001 - a TrainConfig
    """Env steps before the window opens: the run's own warm-up and, for DQN/IQN, a replay buffer
    filled and turned over twice (a Python-list replay keeps the allocator growing until then)."""
    warmup = config.run.warmup_steps
    if config.algo in VALUE_BASED:
        hp = getattr(config, config.algo)
        warmup = max(warmup, (3 * hp.buffer_size + hp.learning_starts) * frames_per_transition(config))
    return warmup


def frames_per_transition(config) -> int:  # noqa: ANN001 - a TrainConfig
    """Env steps (frames) behind one stored transition: ``env.action_repeat`` times, for Atari
    preprocessing, its frame skip (the replay fills 4x slower in frames than in transitions)."""
    frames = config.env.action_repeat
    if config.env.preprocessing == "atari":
        frames *= config.env.atari.frame_skip
    return frames


def _libc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere): hands freed heap pages back to the system."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _libc_malloc_trim()


def retained_rss_mb() -> float:
    """RSS after a garbage collection and, on glibc, ``malloc_trim``: memory still in use, not what the
    allocator keeps cached. Without the trim, RSS of frame-heavy presets (Pong) swings by tens of MB
    between samples while the live objects and tensors stay constant, and a short window's slope
    reads that swing as growth."""
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    return metrics.host_rss_mb()


def growth_per_100k(samples: list[tuple[int, float]]) -> tuple[float, float]:
    """(MB, % of the first sample) of RSS growth per 100k env steps: least-squares slope of the samples."""
    steps = np.array([s for s, _ in samples], dtype=np.float64)
    rss = np.array([r for _, r in samples], dtype=np.float64)
    if len(samples) < 2 or steps[-1] <= steps[0]:
        return 0.0, 0.0
    slope = float(np.polyfit(steps - steps[0], rss, 1)[0]) * PER_STEPS
    return slope, 100.0 * slope / rss[0]


def measure_rss_growth(preset: str, variant: str, *, steps: int = 200_000, samples: int = 21,
                       overrides: tuple[str, ...] = (), warmup_steps: int | None = None) -> RssGrowth:
    """RSS growth of one preset variant over ``steps`` env steps after a leak-free warm-up."""
    (spec,) = specs_for(preset, variant, list(overrides))
    resolution = resolve_config(spec.config)
    warmup = leak_free_warmup(resolution.config) if warmup_steps is None else warmup_steps
    saved = dev.process_settings()
    trainer = build_trainer(resolution)
    try:
        while trainer.env_steps < warmup:
            trainer.iterate()
        start = trainer.env_steps
        every = max(1, steps // max(1, samples - 1))
        points = [(0, retained_rss_mb())]
        lowest = None  # the smallest reading since the last point: a transient (a batch in flight) is not growth
        while trainer.env_steps - start < steps:
            trainer.iterate()
            done = trainer.env_steps - start
            rss = retained_rss_mb()
            lowest = rss if lowest is None else min(lowest, rss)
            if done - points[-1][0] >= every or done >= steps:
                points.append((done, lowest))
                lowest = None
    finally:
        trainer.close()
        dev.restore_process_settings(saved)
    mb, pct = growth_per_100k(points)
    return RssGrowth(spec.preset, spec.variant, warmup, points[-1][0], points[0][1], points[-1][1], mb, pct, points)


def measure_in_fresh_process(preset: str, variant: str, **kwargs: object) -> RssGrowth:
    """``measure_rss_growth`` in a new interpreter: memory an earlier measurement freed but the
    allocator kept would otherwise absorb (hide) growth."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(measure_rss_growth, preset, variant, **kwargs).result()


def format_table(results: list[RssGrowth]) -> str:
    lines = [f"{'preset':<14}{'variant':<11}{'warm-up':>9}{'steps':>9}{'RSS start MB':>14}{'RSS end MB':>12}"
             f"{'MB/100k':>10}{'%/100k':>9}  verdict"]
    for r in results:
        lines.append(f"{r.preset:<14}{r.variant:<11}{r.warmup_steps:>9,}{r.steps:>9,}{r.rss_start_mb:>14.1f}"
                     f"{r.rss_end_mb:>12.1f}{r.growth_mb_per_100k:>10.2f}{r.growth_pct_per_100k:>9.2f}  "
                     f"{'ok' if r.passed else f'LEAK? (limit {LIMIT_PCT:g} %)'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.analyses.rss_growth [PRESET...]``: host RSS growth per 100k env steps after warm-up."""
    parser = argparse.ArgumentParser(prog="python -m harness.analyses.rss_growth", description=main.__doc__)
    parser.add_argument("presets", nargs="*", metavar="PRESET", help="default: every shipped preset")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="baseline,optimized")
    parser.add_argument("--steps", type=int, default=200_000, help="env steps in the measured window")
    parser.add_argument("--samples", type=int, default=21, help="RSS samples along the window")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    args = parser.parse_args(argv)
    results = []
    for preset in args.presets or preset_names():
        for variant in (v for v in args.variants.split(",") if v):
            results.append(measure_in_fresh_process(preset, variant, steps=args.steps, samples=args.samples,
                                                    overrides=tuple(args.overrides)))
            if not args.json:
                print(format_table(results[-1:]).splitlines()[-1], flush=True)
    print(json.dumps([asdict(r) for r in results], indent=2) if args.json else "\n" + format_table(results))
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
