"""Acting paths: how one vector step's observations become actions, chosen once per run.

- Plain (``PerEnvActing``): per sub-env, a host->device copy, a forward and a host copy of its action.
- Optimised (``BatchedActing``, ``batch_inference``): one copy, one forward of every row (or of
  chunks of ``inference_batch_size`` rows), one host copy of the actions.
- ``numpy_acting``: the algorithm's NumPy forward behind the same call (``ppo.acting.NumpyPPOActing``,
  ``value.acting.NumpyEpsilonGreedy``).

An algorithm supplies a ``DevicePolicy`` (PPO's sampling policy, the recurrent one, DQN/IQN's
epsilon-greedy); the paths decide only how its rows are batched. A policy draws the step's noise
for every row in one call before any forward, so each path takes the same actions from the same
draws (CUDA's generator gives other numbers for one call of N than for N calls of one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from reference_trainers.runtime.probe import Probe

__all__ = ["ActingStep", "BatchedActing", "DevicePolicy", "PerEnvActing", "choose_acting"]


class ActingStep(NamedTuple):
    """One vector step's acting: the observations as the policy saw them (a device tensor, or a
    host array on the NumPy path), the policy's outputs (action first, rows in sub-env order),
    and the actions on the host."""

    obs: Any
    outputs: tuple[Any, ...]
    host_actions: np.ndarray


class DevicePolicy(Protocol):
    """What an algorithm gives the torch acting paths."""

    def draw(self) -> Any:
        """This step's random draws (and any per-step inputs) for every sub-env, in one call each."""

    def inputs(self, obs: np.ndarray, start: int, stop: int, draws: Any) -> tuple[torch.Tensor, ...]:
        """Rows ``start:stop`` of the step's inputs on the device, observations first (a transfer)."""

    def __call__(self, inputs: tuple[torch.Tensor, ...], draws: Any, start: int, stop: int) -> tuple[torch.Tensor, ...]:
        """The policy over rows ``start:stop``: (action, *other outputs), no autograd graph."""


def _joined(parts: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    return parts[0] if len(parts) == 1 else tuple(torch.cat(column) for column in zip(*parts))


class PerEnvActing:
    """Plain path: one forward per sub-env and a host copy of each action."""

    def __init__(self, policy: DevicePolicy, num_envs: int, probe: Probe) -> None:
        self.policy, self.num_envs, self.probe = policy, num_envs, probe

    def __call__(self, obs: np.ndarray) -> ActingStep:
        policy, probe = self.policy, self.probe
        observed, parts, host_actions = [], [], []
        with probe.phase("inference"):
            draws = policy.draw()
        for i in range(self.num_envs):
            with probe.phase("transfer"):
                inputs = policy.inputs(obs, i, i + 1, draws)
            with probe.phase("inference"):
                outputs = policy(inputs, draws, i, i + 1)
                host_actions.append(outputs[0].cpu().numpy()[0])
            observed.append(inputs[0])
            parts.append(outputs)
        return ActingStep(torch.cat(observed), _joined(parts), np.stack(host_actions))


class BatchedActing:
    """Optimised path (``batch_inference``): one host->device copy, one forward of every row (or
    of ``chunk`` rows at a time, ``inference_batch_size``), one host copy of the actions."""

    def __init__(self, policy: DevicePolicy, num_envs: int, probe: Probe, chunk: int | None = None) -> None:
        self.policy, self.num_envs, self.probe = policy, num_envs, probe
        self.chunk = chunk or num_envs

    def __call__(self, obs: np.ndarray) -> ActingStep:
        policy, n = self.policy, self.num_envs
        with self.probe.phase("inference"):
            draws = policy.draw()
        with self.probe.phase("transfer"):
            inputs = policy.inputs(obs, 0, n, draws)
        with self.probe.phase("inference"):
            outputs = _joined([policy(tuple(x[s:s + self.chunk] for x in inputs) if self.chunk < n else inputs,
                                      draws, s, min(s + self.chunk, n))
                               for s in range(0, n, self.chunk)])
            host_actions = outputs[0].cpu().numpy()
        return ActingStep(inputs[0], outputs, host_actions)


def choose_acting(policy: DevicePolicy, num_envs: int, probe: Probe, batch_inference: bool,
                  inference_batch_size: int | None, numpy_path: Callable[[np.ndarray], ActingStep] | None
                  ) -> Callable[[np.ndarray], ActingStep]:
    """The run's acting path: ``numpy_path`` where ``numpy_acting`` built one, else batched or per sub-env."""
    if numpy_path is not None:
        return numpy_path
    if batch_inference:
        return BatchedActing(policy, num_envs, probe, inference_batch_size)
    return PerEnvActing(policy, num_envs, probe)
