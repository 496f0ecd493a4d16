"""A fixed yardstick of CPU work, and the paired measurement that divides a trainer's time by it.

The CPU time of the same work drifts on a shared or virtual machine, within a process as much as
between processes (docs/tracking.md, "Why processes of one commit differ"): the cost of an
instruction moves with the physical core's other tenants and its frequency. ``ReferenceWork`` is a
small PPO-shaped loop (a CartPole vector env, a 64x64 tanh MLP acting without a graph, one Adam
minibatch step) written here, in the benchmark suite, and never imported from the project: asv runs
the suite of the working tree against every commit, so both commits of a comparison divide by the
very same code. A trainer's slice and a reference slice alternate a fraction of a second apart, so
whatever the machine does to one it does to the other, and their ratio keeps the code's cost.

The yardstick runs in a sibling process (``SiblingReference``): ``python -I`` on this file, which
imports nothing of the project, with fixed settings (one intra-op and one inter-op thread, highest
float32 matmul precision, float32 default dtype, grad mode on, anomaly detection off) whatever the
trainer's process set. So what a commit does to its own process (a busy background thread, a thread
count, a global torch setting, a hook, a dispatch mode, a default dtype) lands on the trainer's slices
alone: a trainer's slice is charged its whole process's CPU time, every thread of it included.

Do not edit ``ReferenceWork``: its unit is what every stored ``RelativeCost`` value is counted in
(bump ``RelativeCost.version`` if it must change: asv then keeps old values apart from new ones).
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import subprocess
import sys
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


SIBLING_SETTINGS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
"""The sibling's environment on top of the parent's (less any ``TORCH*``/``PYTORCH*`` variable)."""


def fix_settings() -> None:
    """The yardstick's process settings, the same for every commit measured."""
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.set_float32_matmul_precision("highest")
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    torch.autograd.set_detect_anomaly(False)


def current_settings() -> dict[str, object]:
    """The process settings that change what the yardstick's work costs."""
    return {"threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
            "matmul_precision": torch.get_float32_matmul_precision(), "default_dtype": str(torch.get_default_dtype()),
            "grad_enabled": torch.is_grad_enabled(), "anomaly_detection": torch.is_anomaly_enabled()}


def serve(seed: int) -> None:
    """The sibling's loop: ``unit``/``slice``/``settings``/``quit`` lines in on stdin, one line out per request (the
    slice's CPU seconds, this process's own)."""
    fix_settings()
    work = ReferenceWork(seed)
    try:
        for line in sys.stdin:
            request = line.strip()
            if request == "quit":
                break
            if request == "unit":
                work.unit()
                answer = "ok"
            elif request == "slice":
                answer = repr(work.slice())
            elif request == "settings":
                answer = json.dumps(current_settings())
            else:
                answer = f"error: unknown request {request!r} (accepted: unit, slice, settings, quit)"
            sys.stdout.write(answer + "\n")
            sys.stdout.flush()
    finally:
        work.close()


class SiblingReference:
    """``ReferenceWork`` in a sibling process with fixed settings; ``slice()`` returns its CPU seconds.

    The caller blocks while the sibling works, so the two alternate on the machine a moment apart;
    nothing the caller's process does to torch, its threads or its interpreter reaches the yardstick.
    """

    def __init__(self, seed: int = 0, timeout: float = 120.0) -> None:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("TORCH", "PYTORCH"))}
        env.update(SIBLING_SETTINGS)
        self.timeout = timeout
        self.process = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "--serve", str(seed)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1)

    def _ask(self, request: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(request + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        if not answer or answer.startswith("error"):
            code = self.process.poll()
            raise RuntimeError(f"the yardstick's process answered {answer!r} to {request!r} (exit code {code})")
        return answer

    def unit(self) -> None:
        self._ask("unit")

    def slice(self) -> float:
        return float(self._ask("slice"))

    def settings(self) -> dict[str, object]:
        return json.loads(self._ask("settings"))

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self._ask("quit")
            except (OSError, RuntimeError, ValueError):
                pass
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


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
                   reference: ReferenceWork | SiblingReference | None = None,
                   min_slice_seconds: float = MIN_SLICE_SECONDS) -> list[PairedCost]:
    """Run every slot ``rounds`` times, each run between two reference slices: R S1 R S2 R ... R.

    A slot is called with a repeat count, fixed per slot from one timed call so that a slice takes at
    least ``min_slice_seconds``, and returns how much work it did (env steps, selections). Its ratio in
    a round is its CPU seconds over the mean of the reference slices just before and just after it
    (which cancels a drift that is linear over the pair), per unit of its work. Slots take turns, so a
    change in the machine's speed in the middle lands on every slot alike. Without ``reference``, the
    yardstick is a ``SiblingReference`` (its own process, fixed settings).
    """
    own = reference is None
    reference = reference or SiblingReference()
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


if __name__ == "__main__":
    if sys.argv[1:2] != ["--serve"]:
        sys.exit("usage: python -I reference_work.py --serve SEED")
    serve(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
