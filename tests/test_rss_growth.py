"""Host memory growth (``harness.analyses.rss_growth``): the slope is measured right, a planted leak is caught,
and (slow) the shipped presets stay under 5 % RSS growth per 100k env steps after warm-up."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conftest import TINY
from harness.analyses.rss_growth import LIMIT_PCT, growth_per_100k, leak_free_warmup, measure_in_fresh_process, measure_rss_growth
from reference_trainers import IterationResult
from reference_trainers.config.schema import build_config
from reference_trainers.ppo.trainer import PPOTrainer


def test_growth_is_the_least_squares_slope_per_100k_steps_relative_to_the_start() -> None:
    samples = [(s, 200.0 + 0.0001 * s + (0.5 if i % 2 else -0.5)) for i, s in enumerate(range(0, 50_001, 5_000))]
    mb, pct = growth_per_100k(samples)
    assert mb == pytest.approx(10.0, abs=0.2)  # 0.0001 MB per step; the +-0.5 MB jitter averages out
    assert pct == pytest.approx(100 * mb / samples[0][1])
    assert growth_per_100k([(0, 100.0)]) == (0.0, 0.0)


def test_the_warm_up_covers_filling_and_turning_over_the_replay_buffer() -> None:
    ppo = build_config({}, ["run.warmup_steps=2048"])
    dqn = build_config({}, ["algo=dqn", "run.warmup_steps=2048", "dqn.buffer_size=50000", "dqn.learning_starts=1000"])
    assert leak_free_warmup(ppo) == 2048
    assert leak_free_warmup(dqn) == 3 * 50_000 + 1000
    # Atari: every transition is frame_skip env steps (frames), so the replay fills in 4x the env steps
    pong = build_config({}, ["algo=dqn", "env.id=ALE/Pong-v5", "env.preprocessing=atari", "env.atari.frame_skip=4",
                             "run.warmup_steps=0", "dqn.buffer_size=5000", "dqn.learning_starts=256"])
    assert leak_free_warmup(pong) == (3 * 5000 + 256) * 4


def test_a_planted_leak_is_reported_as_growth_above_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    leaked: list[Any] = []
    iterate = PPOTrainer.iterate

    def leaking_iterate(trainer: PPOTrainer) -> IterationResult:
        done = iterate(trainer)
        # 36 MiB, written, per iteration (32 env steps): above glibc's largest mmap threshold (32 MiB),
        # so always fresh pages, never heap memory that earlier tests in this process freed
        leaked.append(np.ones(36 * 2**17))
        return done

    monkeypatch.setattr(PPOTrainer, "iterate", leaking_iterate)
    result = measure_rss_growth("ppo-cartpole", "baseline", steps=320, samples=5, overrides=tuple(TINY),
                                warmup_steps=0)
    assert result.growth_mb_per_100k > 25_000  # ~112,000 MB per 100k steps planted; RSS sampling blurs it
    assert result.growth_pct_per_100k > LIMIT_PCT and not result.passed
    assert result.steps >= 320 and len(result.samples) >= 5


VALUE_BASED_SMALL_REPLAY = {"dqn": ["dqn.buffer_size=2500"], "iqn": ["iqn.buffer_size=2500"], "ppo": []}


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["baseline", "optimized"])
@pytest.mark.parametrize("preset", ["ppo-cartpole", "dqn-cartpole", "iqn-cartpole"])
def test_presets_grow_host_memory_less_than_the_limit_after_warm_up(preset: str, variant: str) -> None:
    """A 24k-step window after warm-up (replay shrunk to 2,500 so it fills and turns over sooner); the
    full check over every preset and 100k steps is ``python -m harness.analyses.rss_growth``."""
    # one torch thread: beside the other test workers, a second thread only spins (memory is what is measured)
    result = measure_in_fresh_process(preset, variant, steps=24_000, samples=11,
                                      overrides=("device=cpu", "optimizations.torch_threads=1",
                                                 *VALUE_BASED_SMALL_REPLAY[preset.split("-")[0]]))
    assert result.growth_pct_per_100k < LIMIT_PCT, result
