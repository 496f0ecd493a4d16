"""What the asv benchmarks share: their parameters, device checks and seeded, cached inputs.

Inputs here are only ever appended to. Changing an existing one (a seed, a step budget, a
shape) changes what its benchmark measures and silently breaks the history asv has for it;
add a new name instead.

Adding a trainer's presets is one line: append them to ``PRESETS`` with a ``RUN_STEPS`` entry.
Replay buffers are measured on their own in ``bench_replay.py`` (``REPLAY_*`` below).
"""

from __future__ import annotations

import functools
import time

import gymnasium as gym
import numpy as np

from harness.specs.presets import specs_for
from harness.measurement.runner import VariantSpec
from reference_trainers import build_trainer
from reference_trainers.runtime import device as dev
from reference_trainers.config.resolve import resolve_config

PRESETS = ["ppo-cartpole", "ppo-acrobot", "ppo-pendulum", "dqn-cartpole", "iqn-cartpole"]
VARIANTS = ["baseline", "optimized"]
DEVICES = ["cpu", "cuda", "mps"]
PARAMS = (PRESETS, VARIANTS, DEVICES)
PARAM_NAMES = ["preset", "variant", "device"]

RUN_STEPS = {"ppo-cartpole": 2048, "ppo-acrobot": 2048, "ppo-pendulum": 2048, "dqn-cartpole": 2048,
             "iqn-cartpole": 2048}
"""Timed env steps per repeat of the throughput runs (a multiple of each preset's rollout size)."""
THROUGHPUT_REPEATS = 5
WARMUP_STEPS = 1024
REPLAY_KINDS = ["list", "tensor"]
REPLAY_CAPACITIES = [10_000, 100_000]
REPLAY_OBS_DIM = 4
REPLAY_ROWS_PER_INSERT = 16
"""One vector-env step of the DQN/IQN presets' 16 envs."""
REPLAY_BATCH_SIZE = 256
OBS_SEED = 12345
OBS_WARM_STEPS = 50
"""Observations for latency benchmarks: reset with OBS_SEED, then OBS_WARM_STEPS random steps."""


def available(device: str) -> bool:
    return {"cpu": True, "cuda": dev.cuda_available(), "mps": dev.mps_available()}[device]


def skip_unless_available(device: str) -> None:
    """asv's way to skip a parameter combination: ``NotImplementedError`` from ``setup``."""
    if not available(device):
        raise NotImplementedError(f"{device} is not available on this machine")


def throughput_overrides(preset: str, device: str) -> list[str]:
    return [f"device={device}", f"run.steps={RUN_STEPS[preset]}", f"run.warmup_steps={WARMUP_STEPS}",
            f"run.repeats={THROUGHPUT_REPEATS}", "run.latency_samples=20"]


def spec(preset: str, variant: str, overrides: list[str]) -> VariantSpec:
    (one,) = specs_for(preset, variant, overrides)
    return one


def build(preset: str, variant: str, device: str, overrides: tuple[str, ...] = ()):  # noqa: ANN201 - a trainer
    """A trainer for one preset variant on ``device``, with its process settings applied."""
    resolution = resolve_config(spec(preset, variant, [f"device={device}", *overrides]).config)
    trainer = build_trainer(resolution)
    trainer.activate()
    return trainer


@functools.lru_cache(maxsize=None)
def observations(env_id: str, num_envs: int) -> np.ndarray:
    """A fixed batch of ``num_envs`` float32 observations of ``env_id`` (seeded, reached by random play)."""
    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
    try:
        obs, _ = env.reset(seed=OBS_SEED)
        env.action_space.seed(OBS_SEED)
        for _ in range(OBS_WARM_STEPS):
            obs, *_ = env.step(env.action_space.sample())
    finally:
        env.close()
    return np.asarray(obs, dtype=np.float32)

# --------------------------------------------------------------------------- CPU-time benchmarks (gated across commits)

CPU_TIME_ROUNDS = 3
"""Processes per commit of each gated CPU-time benchmark: ``asv continuous`` interleaves them
across the two commits (base, head, head, base, ...), so a process-level effect (where the
allocator put things, what the neighbours did) lands on both sides."""
CPU_TIME_REPEATS = 3
"""Samples per process of the CPU-time benchmarks: 3 x 3 = 9 per commit. asv's two-sided
Mann-Whitney test needs p < 0.002, which 6 samples a side can never reach (two samples sets
apart from end to end give p = 0.0022) and 7 reach only without any overlap."""
ACTION_SELECTIONS = 50
"""Batched action selections per sample of ``InferenceCpuTime.time_50_action_selections``."""


def process_cpu_seconds() -> float:
    """This process's user + system CPU time (all its threads; not its children's): the clock of
    the gated benchmarks. Other processes on the machine slow its wall time, not its CPU time."""
    return time.process_time()


class CpuTimeBenchmark:
    """asv's settings shared by the gated CPU-time benchmarks: process CPU seconds as the clock, one call
    a sample, ``CPU_TIME_REPEATS`` samples in each of ``CPU_TIME_ROUNDS`` interleaved processes, no
    asv warm-up (each ``setup`` warms its trainer up)."""

    params = PARAMS
    param_names = PARAM_NAMES
    timer = staticmethod(process_cpu_seconds)
    number = 1
    repeat = CPU_TIME_REPEATS
    rounds = CPU_TIME_ROUNDS
    warmup_time = 0.0
    timeout = 300


def skip_unless_cpu(device: str) -> None:
    """The CPU-time benchmarks run on the CPU device only: on a GPU the host's CPU time is not the
    training time (the wall-time benchmarks cover cuda and mps)."""
    skip_unless_available(device)
    if device != "cpu":
        raise NotImplementedError(f"{device}: the CPU-time benchmarks measure the cpu device only; "
                                  "the wall-time benchmarks cover it")


@functools.lru_cache(maxsize=None)
def warmed_trainer(preset: str, variant: str, device: str):  # noqa: ANN201 - a trainer
    """One trainer per (preset, variant, device) and process, built and trained past WARMUP_STEPS
    env steps (and so past the DQN/IQN presets' ``learning_starts``): asv re-runs ``setup`` before
    every sample, and a sample should time training, not construction or warm-up."""
    trainer = build(preset, variant, device)
    train_env_steps(trainer, WARMUP_STEPS)
    return trainer


def train_env_steps(trainer, env_steps: int) -> int:  # noqa: ANN001 - a trainer
    """Whole training iterations until at least ``env_steps`` more env steps were taken; returns them."""
    start = trainer.env_steps
    while trainer.env_steps - start < env_steps:
        trainer.iterate()
    return trainer.env_steps - start
CPU_TIME_STEPS = {"ppo-cartpole": 2048, "ppo-acrobot": 2048, "dqn-cartpole": 512, "iqn-cartpole": 512}
"""Env steps per sample of ``TrainingCpuTime``, for the presets it gates: one PPO iteration
(rollout and update); 32 sixteen-env steps of DQN / IQN, each with its update. A preset without
an entry is skipped there, to keep ``asv continuous`` within a CI budget on two cores:
``ppo-pendulum``'s update costs several times ``ppo-cartpole``'s and shares its code but for
the action head, which ``InferenceCpuTime`` gates."""

COUNT_STEPS = 256
"""Env steps (whole iterations, at least this many: one PPO rollout and its update, 16 DQN / IQN vector
steps) counted per preset variant by ``bench_counts``."""
COUNT_PRESETS = ["ppo-cartpole", "ppo-acrobot", "dqn-cartpole", "iqn-cartpole"]
"""The presets ``bench_counts`` counts: ``ppo-pendulum`` is left out, as from ``TrainingCpuTime``: its
update shares ppo-cartpole's code but for the action head, and counting it costs minutes a commit."""
