"""DQN and IQN's acting: epsilon-greedy over the algorithm's Q-values, on every acting path.

- ``EpsilonGreedy``: the torch policy the shared acting paths batch (``paths.acting``): the
  step's draws for every row in one call each (``ActingNoise``), the greedy action of the
  algorithm's ``q_values``, and the torch ``where`` that explores.
- ``NumpyEpsilonGreedy``: ``numpy_acting``'s path, the Q-network's forward and the choice in
  NumPy from the same torch draws (``HostNoise``: per step, or a block of steps under ``block_noise``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from reference_trainers.paths.acting import ActingStep
from reference_trainers.nets.mlp import NumpyMLP
from reference_trainers.paths.numpy_acting import in_chunks
from reference_trainers.paths.speedups import HostToDevice
from reference_trainers.runtime.probe import Probe

__all__ = ["ActingNoise", "EpsilonGreedy", "HostNoise", "NumpyEpsilonGreedy", "QFunction"]


class QFunction(Protocol):
    """What the algorithm (DQN, IQN) gives acting."""

    def q_values(self, obs: torch.Tensor, fractions: torch.Tensor | None = None) -> torch.Tensor: ...

    def acting_fractions(self, rows: int) -> torch.Tensor | None: ...


class ActingNoise(NamedTuple):
    """One step's random draws for epsilon-greedy acting, one row per sub-env."""

    uniform: torch.Tensor                  # explore where uniform < epsilon
    random_action: torch.Tensor            # the action taken when exploring
    fractions: torch.Tensor | None         # IQN's quantile fractions (rows, K); None for DQN

    def rows(self, start: int, stop: int) -> ActingNoise:
        fractions = None if self.fractions is None else self.fractions[start:stop]
        return ActingNoise(self.uniform[start:stop], self.random_action[start:stop], fractions)


class HostNoise:
    """``numpy_acting``'s epsilon-greedy draws as NumPy rows, handed out one vector step at a time.

    Plain path (``block_steps`` 1): two torch calls (``torch.rand``, ``torch.randint``) per step.
    ``block_noise``: the draws of ``block_steps`` steps (``tuning.noise_block_steps``) in those two
    calls. On the CPU one call for (steps, rows) gives the same numbers, in order, as one call per
    step, so every step sees the same draws either way (``test_host_noise_gives_the_per_step_draws``).
    ``state_dict`` keeps the rows not yet handed out: a resumed run goes on with them, then draws
    from the restored generators.
    """

    def __init__(self, rows: int, num_actions: int, explore: torch.Generator, action: torch.Generator,
                 block_steps: int = 1) -> None:
        self.rows, self.num_actions, self.block_steps = rows, num_actions, block_steps
        self.explore, self.action = explore, action
        self.uniform = np.empty((0, rows), dtype=np.float32)
        self.random_action = np.empty((0, rows), dtype=np.int64)
        self.position = 0

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        """This step's (uniform, random action), one per sub-env."""
        if self.position == len(self.uniform):
            shape = (self.block_steps, self.rows)
            self.uniform = torch.rand(shape, generator=self.explore).numpy()
            self.random_action = torch.randint(self.num_actions, shape, generator=self.action).numpy()
            self.position = 0
        step = self.position
        self.position += 1
        return self.uniform[step], self.random_action[step]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"uniform": torch.from_numpy(self.uniform[self.position:].copy()),
                "random_action": torch.from_numpy(self.random_action[self.position:].copy())}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.uniform, self.random_action = state["uniform"].numpy(), state["random_action"].numpy()
        self.position = 0


class EpsilonGreedy:
    """Epsilon-greedy on the device for ``paths.acting``: outputs (action,) per row; the greedy
    action is the argmax of the algorithm's ``q_values`` (IQN: at the rows' fractions), replaced
    by the step's random action where its uniform falls below ``epsilon()``."""

    def __init__(self, algorithm: QFunction, autocast: Callable[[], AbstractContextManager], to_device: HostToDevice,
                 explore: torch.Generator, action: torch.Generator, device: torch.device, num_envs: int,
                 num_actions: int, obs_shape: tuple[int, ...], epsilon: Callable[[], float]) -> None:
        self.algorithm, self.autocast, self.to_device = algorithm, autocast, to_device
        self.explore, self.action, self.device = explore, action, device
        self.num_envs, self.num_actions, self.obs_shape, self.epsilon = num_envs, num_actions, obs_shape, epsilon

    def draw(self) -> tuple[ActingNoise, float]:
        """This step's draws for every sub-env, each in one call, and its epsilon."""
        n = self.num_envs
        noise = ActingNoise(torch.rand(n, generator=self.explore, device=self.device),
                            torch.randint(self.num_actions, (n,), generator=self.action, device=self.device),
                            self.algorithm.acting_fractions(n))
        return noise, self.epsilon()

    def inputs(self, obs: np.ndarray, start: int, stop: int, draws: Any) -> tuple[torch.Tensor, ...]:
        rows = stop - start
        name = "obs" if rows == self.num_envs else "obs_row"
        return (self.to_device.observations(obs[start:stop].reshape(rows, *self.obs_shape), name),)

    def greedy(self, obs: torch.Tensor, fractions: torch.Tensor | None) -> torch.Tensor:
        with torch.no_grad(), self.autocast():
            return self.algorithm.q_values(obs, fractions).float().argmax(-1)

    def __call__(self, inputs: tuple[torch.Tensor, ...], draws: tuple[ActingNoise, float], start: int, stop: int
                 ) -> tuple[torch.Tensor]:
        noise, epsilon = draws[0].rows(start, stop), draws[1]
        greedy = self.greedy(inputs[0], noise.fractions)
        return (torch.where(noise.uniform < epsilon, noise.random_action, greedy),)


class NumpyEpsilonGreedy:
    """``numpy_acting``: the greedy forward (all sub-envs at once or per sub-env / chunk of
    ``chunk`` rows, as ``batch_inference`` says) and the epsilon-greedy choice in NumPy, from
    the same torch draws as the other paths (``HostNoise``). ``q_network`` is the Q-network's
    NumPy forward over zero-copy views of its weights (an optimiser step shows through)."""

    def __init__(self, q_network: NumpyMLP, noise: HostNoise, probe: Probe, num_envs: int, chunk: int,
                 epsilon: Callable[[], float]) -> None:
        self.q_network, self.noise, self.probe = q_network, noise, probe
        self.num_envs, self.chunk, self.epsilon = num_envs, chunk, epsilon

    def __call__(self, obs: np.ndarray) -> ActingStep:
        with self.probe.phase("inference"):
            uniform, random_action = self.noise.next()
            obs = obs.reshape(self.num_envs, -1)
            greedy = in_chunks(self.q_network, obs, self.chunk).argmax(-1)
            return ActingStep(obs, (), np.where(uniform < self.epsilon(), random_action, greedy))
