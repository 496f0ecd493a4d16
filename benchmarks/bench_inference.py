"""Inference latency: one batched action selection for ``num_envs`` observations (host in,
env-ready actions out, host<->device copies included), as the trainer does it each step.

``InferenceLatency`` is wall time per selection (the site's history);
``InferenceCpuTime`` is what a merge is gated on: the process CPU seconds of
``ACTION_SELECTIONS`` selections, on one warmed-up trainer per process, over
``CPU_TIME_ROUNDS`` interleaved processes per commit (see ``bench_throughput``)."""

from __future__ import annotations

import functools

from reference_trainers.runtime import device as dev

from .common import ACTION_SELECTIONS, PARAM_NAMES, PARAMS, CpuTimeBenchmark, build, observations, \
    skip_unless_available, skip_unless_cpu


@functools.lru_cache(maxsize=None)
def acting_trainer(preset: str, variant: str, device: str):  # noqa: ANN201 - a trainer
    """One trainer per (preset, variant, device) and process, its action selection warmed up:
    asv re-runs ``setup`` before every sample, and a sample should time selections, not construction."""
    trainer = build(preset, variant, device)
    obs = observations(trainer.config.env.id, trainer.num_envs)
    for _ in range(ACTION_SELECTIONS):
        trainer.select_actions(obs)
    return trainer


class InferenceLatency:
    params = PARAMS
    param_names = PARAM_NAMES
    timeout = 120
    warmup_time = 0.2
    # 2: a sample times a warmed-up selection. Version 1 built a fresh trainer for every sample
    # (asv re-runs setup before each), so it timed the first call after construction, many times
    # a warmed call and the cause of its A/A swings (measured in docs/tracking.md).
    version = "2"

    def setup(self, preset: str, variant: str, device: str) -> None:
        skip_unless_available(device)
        self.saved = dev.process_settings()
        self.trainer = acting_trainer(preset, variant, device)
        self.trainer.activate()
        self.device = self.trainer.device
        self.obs = observations(self.trainer.config.env.id, self.trainer.num_envs)

    def teardown(self, preset: str, variant: str, device: str) -> None:
        if hasattr(self, "saved"):  # asv calls teardown after a skipping setup too
            dev.restore_process_settings(self.saved)  # the trainer lives on for the next sample

    def time_select_actions(self, preset: str, variant: str, device: str) -> None:
        self.trainer.select_actions(self.obs)
        dev.synchronize(self.device)


class InferenceCpuTime(CpuTimeBenchmark):
    def setup(self, preset: str, variant: str, device: str) -> None:
        skip_unless_cpu(device)
        self.trainer = acting_trainer(preset, variant, device)
        self.trainer.activate()
        self.obs = observations(self.trainer.config.env.id, self.trainer.num_envs)

    def time_50_action_selections(self, preset: str, variant: str, device: str) -> None:
        for _ in range(ACTION_SELECTIONS):
            self.trainer.select_actions(self.obs)
