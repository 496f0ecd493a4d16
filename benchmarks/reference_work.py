"""A fixed yardstick of CPU work, and the paired measurement that divides a trainer's time by it.

The CPU time of the same work drifts on a shared or virtual machine, within a process as much as
between processes (docs/tracking.md, "Why processes of one commit differ"): the cost of an
instruction moves with the physical core's other tenants and its frequency. ``ReferenceWork`` is a
small PPO-shaped loop (a CartPole vector env, a 64x64 tanh MLP acting without a graph, one Adam
minibatch step) written here, in the benchmark suite, and never imported from the project: asv runs
the suite of the working tree against every commit, so both commits of a comparison divide by the
very same code. A trainer's slice and a reference slice alternate a fraction of a second apart, so
whatever the machine does to one it does to the other, and their ratio keeps the code's cost.

Do not edit ``ReferenceWork``: its unit is what every stored ``RelativeCost`` value is counted in
(bump ``RelativeCost.version`` if it must change: asv then keeps old values apart from new ones).
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gymnasium as gym
import torch

REFERENCE_ENVS = 16
REFERENCE_STEPS_PER_UNIT = 8
REFERENCE_UNITS_PER_SLICE = 16
"""Reference units between two trainer slices (a unit is 8 vector steps of acting and one
minibatch update, a few milliseconds of CPU)."""
MIN_SLICE_SECONDS = 0.05
"""A trainer slice repeats its work until it takes at least this much CPU (set once per process):
a slice of a millisecond is timer resolution and cache warmth more than code."""


def cpu_seconds() -> float:
    """This process's CPU time, all its threads: what another process on the machine cannot add to."""
    return time.process_time()


class ReferenceWork:
    """The yardstick: a seeded mini PPO on CartPole, one ``unit()`` at a time."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.env = gym.make_vec("CartPole-v1", num_envs=REFERENCE_ENVS, vectorization_mode="sync")
        self.obs, _ = self.env.reset(seed=seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                       torch.nn.Tanh(), torch.nn.Linear(64, 3))
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=2.5e-4, foreach=False)

    def unit(self) -> None:
        observations, actions, rewards = [], [], []
        for _ in range(REFERENCE_STEPS_PER_UNIT):
            obs = torch.as_tensor(self.obs, dtype=torch.float32)
            with torch.no_grad():
                probs = torch.softmax(self.net(obs)[:, :2], dim=-1)
                action = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
            self.obs, reward, _terminated, _truncated, _info = self.env.step(action.numpy())
            observations.append(obs)
            actions.append(action)
            rewards.append(torch.as_tensor(reward, dtype=torch.float32))
        obs, action, reward = torch.cat(observations), torch.cat(actions), torch.cat(rewards)
        out = self.net(obs)
        logp = torch.log_softmax(out[:, :2], dim=-1).gather(1, action[:, None]).squeeze(1)
        loss = -(logp * reward).mean() + ((out[:, 2] - reward) ** 2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), 0.5)
        self.optimizer.step()

    def slice(self) -> float:
        """CPU seconds of ``REFERENCE_UNITS_PER_SLICE`` units."""
        start = cpu_seconds()
        for _ in range(REFERENCE_UNITS_PER_SLICE):
            self.unit()
        return cpu_seconds() - start

    def close(self) -> None:
        self.env.close()


@dataclass
class PairedCost:
    """One measured slot: its cost per unit of its work in reference slices, one ratio a round."""

    ratios: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)


def _repeats_for(slot: Callable[[int], float], min_seconds: float) -> int:
    start = cpu_seconds()
    slot(1)
    once = max(cpu_seconds() - start, 1e-6)
    return max(1, math.ceil(min_seconds / once))


def measure_paired(slots: Sequence[Callable[[int], float]], rounds: int,
                   reference: ReferenceWork | None = None,
                   min_slice_seconds: float = MIN_SLICE_SECONDS) -> list[PairedCost]:
    """Run every slot ``rounds`` times, each run between two reference slices: R S1 R S2 R ... R.

    A slot is called with a repeat count, fixed per slot from one timed call so that a slice takes at
    least ``min_slice_seconds``, and returns how much work it did (env steps, selections). Its ratio in
    a round is its CPU seconds over the mean of the reference slices just before and just after it
    (which cancels a drift that is linear over the pair), per unit of its work. Slots take turns, so a
    change in the machine's speed in the middle lands on every slot alike.
    """
    own = reference is None
    reference = reference or ReferenceWork()
    ratios: list[list[float]] = [[] for _ in slots]
    try:
        reference.unit()  # the first call pays torch's lazy set-up
        repeats = [_repeats_for(slot, min_slice_seconds) for slot in slots]
        gc.collect()
        before = reference.slice()
        for _ in range(rounds):
            for index, slot in enumerate(slots):
                start = cpu_seconds()
                work = slot(repeats[index])
                spent = cpu_seconds() - start
                after = reference.slice()
                ratios[index].append(spent / ((before + after) / 2) / work)
                before = after
    finally:
        if own:
            reference.close()
    return [PairedCost(r) for r in ratios]
