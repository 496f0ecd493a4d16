"""The gated timing benchmarks: each preset variant's CPU cost counted in a fixed yardstick's units.

A raw CPU time of one process is not a unit with a fixed speed on a shared or virtual machine:
identical code measured 2x apart between processes and as widely within one (docs/tracking.md). Here
one process per commit builds every (preset, variant) trainer, then takes ``RELATIVE_ROUNDS`` turns
through them; each turn times one training slice and one acting slice of each, every slice between
two slices of ``reference_work.ReferenceWork`` (code of this suite, the same for both commits of a
comparison, run in a sibling process with fixed settings: what a commit does to its own process is
charged to its slices alone, every thread of it). A value is the median over the rounds of slice CPU seconds / reference CPU seconds, per
1k env steps (training) or per 100 action selections (acting): the machine's speed cancels, the
code's cost stays. Measured once per benchmark run (``setup_cache``); the ``track_`` methods only
read, so asv compares one value per commit by its factor (``make asv-continuous``'s ``ASV_FACTOR``,
set from measured A/A runs).
"""

from __future__ import annotations

from collections.abc import Callable

from .common import COUNT_PRESETS, DEVICES, PARAM_NAMES, VARIANTS, available, build, observations, \
    skip_unless_available, train_env_steps, WARMUP_STEPS
from .reference_work import measure_paired

RELATIVE_PRESETS = COUNT_PRESETS
"""ppo-cartpole, ppo-acrobot, dqn-cartpole, iqn-cartpole: ``ppo-pendulum``'s update shares
ppo-cartpole's code but for the action head, and measuring it costs a minute a commit."""
RELATIVE_ROUNDS = 21
"""Turns through every slot; a value is the median of this many paired ratios."""
TRAINING_SLICE_STEPS = {"ppo-cartpole": 1024, "ppo-acrobot": 1024, "dqn-cartpole": 128, "iqn-cartpole": 128}
"""Env steps per training slice (whole iterations: one PPO rollout and its update; eight 16-env
DQN / IQN steps with their updates)."""
ACTING_SLICE_SELECTIONS = 20
"""Batched action selections per acting slice."""


def _training_slot(trainer, env_steps: int) -> Callable[[int], float]:  # noqa: ANN001 - a trainer
    """Trains ``repeats`` x ``env_steps`` env steps (whole iterations); its work in 1k env steps."""
    def run(repeats: int) -> float:
        trainer.activate()
        return train_env_steps(trainer, repeats * env_steps) / 1000
    return run


def _acting_slot(trainer) -> Callable[[int], float]:  # noqa: ANN001 - a trainer
    """``repeats`` x ``ACTING_SLICE_SELECTIONS`` batched selections; its work in 100 selections."""
    obs = observations(trainer.config.env.id, trainer.num_envs)

    def run(repeats: int) -> float:
        trainer.activate()
        for _ in range(repeats * ACTING_SLICE_SELECTIONS):
            trainer.select_actions(obs)
        return repeats * ACTING_SLICE_SELECTIONS / 100
    return run


def measure_relative(rounds: int = RELATIVE_ROUNDS) -> dict[str, dict[str, float]]:
    """Every (preset, variant) on the CPU: its training and acting cost in reference slices."""
    trainers, slots, keys = [], [], []
    try:
        for preset in RELATIVE_PRESETS:
            for variant in VARIANTS:
                learner, actor = build(preset, variant, "cpu"), build(preset, variant, "cpu")
                trainers += [learner, actor]
                train_env_steps(learner, WARMUP_STEPS)
                acting = _acting_slot(actor)
                acting(1)  # warmed up, as the learner is
                slots += [_training_slot(learner, TRAINING_SLICE_STEPS[preset]), acting]
                keys += [(f"{preset}/{variant}/cpu", "training"), (f"{preset}/{variant}/cpu", "acting")]
        measured = measure_paired(slots, rounds)
    finally:
        for trainer in trainers:
            trainer.close()
    costs: dict[str, dict[str, float]] = {}
    for (key, kind), paired in zip(keys, measured):
        costs.setdefault(key, {})[kind] = paired.median
    return costs


class RelativeCost:
    params = (RELATIVE_PRESETS, VARIANTS, DEVICES)
    param_names = PARAM_NAMES
    timeout = 600
    # asv versions a benchmark by its own source, which here only reads the cache: bump this whenever the
    # yardstick (reference_work.ReferenceWork) or a slice's work changes, so that stored values of another unit
    # are never compared with new ones
    version = "2"

    def setup_cache(self) -> dict[str, dict[str, float]]:
        return measure_relative()

    setup_cache.timeout = 900  # type: ignore[attr-defined]

    def setup(self, costs: dict[str, dict[str, float]], preset: str, variant: str, device: str) -> None:
        skip_unless_available(device)
        if device != "cpu":
            raise NotImplementedError(f"{device}: the relative costs measure the cpu device only (the host's CPU "
                                      "time is not a GPU's training time; the wall-time benchmarks cover it)")
        self.costs = costs[f"{preset}/{variant}/{device}"]

    def track_training_cost(self, costs: dict, preset: str, variant: str, device: str) -> float:
        return self.costs["training"]

    track_training_cost.unit = "ref slices/1k steps"  # type: ignore[attr-defined]

    def track_acting_cost(self, costs: dict, preset: str, variant: str, device: str) -> float:
        return self.costs["acting"]

    track_acting_cost.unit = "ref slices/100 selections"  # type: ignore[attr-defined]
