"""PPO's policy: its action distribution (sampling, log-probabilities, entropy) and how it acts.

- ``action_noise``, ``sample_action``, ``evaluate_actions``: the distribution (categorical over
  logits, or a diagonal Gaussian with a state-independent ``log_std``), in torch.
- ``PPOPolicy``: the torch policy the shared acting paths batch (``paths.acting``): the
  actor-critic forward, the model's own (plain) or one stacked network (``stacked_mlps``).
- ``NumpyPPOActing``: ``numpy_acting``'s path, the same forward and sampling in NumPy from the
  same torch noise (``block_noise``: the rollout's noise drawn as it starts).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from reference_trainers.nets.mlp import NumpyMLP, StackedMLPs, host_view
from reference_trainers.paths import numpy_acting as host
from reference_trainers.paths.acting import ActingStep
from reference_trainers.paths.speedups import HostToDevice
from reference_trainers.runtime.probe import Probe

LOG_2PI = math.log(2 * math.pi)

__all__ = ["NumpyPPOActing", "PPOPolicy", "action_noise", "evaluate_actions", "sample_action"]


# --------------------------------------------------------------------------- the distribution

def action_noise(rows: int, discrete: bool, action_shape: tuple[int, ...], generator: torch.Generator,
                 device: torch.device) -> torch.Tensor:
    """One step's sampling noise for ``rows`` sub-envs, drawn in one call whatever the inference path.

    A row's action depends only on its own row of noise, so a per-env forward, chunked or
    batched inference sample the same actions on every device (CUDA's generator gives
    other numbers for one call of N than for N calls of one).
    """
    if discrete:  # one uniform per row: inverse-CDF sampling
        return torch.rand(rows, generator=generator, device=device)
    return torch.randn((rows, *action_shape), generator=generator, device=device, dtype=torch.float32)


def sample_action(actor_out: torch.Tensor, log_std: torch.Tensor | None, noise: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Actions and their log-probabilities (float32) from the policy head and this step's ``action_noise``."""
    actor_out = actor_out.float()
    if log_std is None:  # categorical over logits: the first action whose cumulative probability reaches u
        log_probs = F.log_softmax(actor_out, dim=-1)
        below = log_probs.exp().cumsum(-1) < noise.unsqueeze(-1)
        action = below.sum(-1).clamp_(max=actor_out.shape[-1] - 1)
        return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    action = actor_out + log_std.exp() * noise
    return action, gaussian_log_prob(actor_out, log_std, action)


def gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Diagonal Gaussian log-density, summed over action dimensions."""
    z = (action - mean) * torch.exp(-log_std)
    return (-0.5 * z.pow(2) - log_std - 0.5 * LOG_2PI).sum(-1)


def evaluate_actions(actor_out: torch.Tensor, log_std: torch.Tensor | None, action: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability and entropy of given actions under the current policy."""
    actor_out = actor_out.float()
    if log_std is None:
        log_probs = F.log_softmax(actor_out, dim=-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1), entropy
    entropy = (0.5 + 0.5 * LOG_2PI + log_std).sum(-1).expand(actor_out.shape[0])
    return gaussian_log_prob(actor_out, log_std, action), entropy


# --------------------------------------------------------------------------- acting in torch

class PPOPolicy:
    """The actor-critic's sampling policy on the device, for ``paths.acting``: outputs (action,
    log-probability, value) per row, the noise of every row drawn in one ``action_noise`` call."""

    def __init__(self, model: nn.Module, forward: Callable[..., Any], autocast: Callable[[], AbstractContextManager],
                 to_device: HostToDevice, generator: torch.Generator, device: torch.device, num_envs: int,
                 obs_shape: tuple[int, ...], stacked_mlps: bool) -> None:
        self.model, self.forward, self.autocast, self.to_device = model, forward, autocast, to_device
        self.generator, self.device, self.num_envs, self.obs_shape = generator, device, num_envs, obs_shape
        self.discrete: bool = model.discrete
        self.stacked_mlps = stacked_mlps
        self.stacked: StackedMLPs | None = None  # stacked_mlps: the snapshot of actor and critic acting uses

    def drop_snapshot(self) -> None:
        """Forget the stacked snapshot: the weights changed."""
        self.stacked = None

    def log_std(self) -> torch.Tensor | None:
        return None if self.discrete else self.model.log_std

    def draw(self) -> torch.Tensor:
        shape = () if self.discrete else tuple(self.model.log_std.shape)
        return action_noise(self.num_envs, self.discrete, shape, self.generator, self.device)

    def inputs(self, obs: np.ndarray, start: int, stop: int, draws: Any) -> tuple[torch.Tensor, ...]:
        rows = stop - start
        name = "obs" if rows == self.num_envs else "obs_row"
        return (self.to_device.observations(obs[start:stop].reshape(rows, *self.obs_shape), name),)

    def actor_critic(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(actor output, value): the model's own forward (plain), or under ``stacked_mlps`` one
        stacked network (``StackedMLPs``, snapshot once per rollout: one matmul per layer for both)."""
        if not self.stacked_mlps:
            return self.forward(obs)
        if self.stacked is None:
            self.stacked = StackedMLPs(self.model.actor, self.model.critic)
        actor_out, value = self.stacked(obs)
        return actor_out, value.squeeze(-1)

    def __call__(self, inputs: tuple[torch.Tensor, ...], draws: torch.Tensor, start: int, stop: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            with self.autocast():
                actor_out, value = self.actor_critic(inputs[0])
            action, logprob = sample_action(actor_out, self.log_std(), draws[start:stop])
        return action, logprob, value.float()


# --------------------------------------------------------------------------- acting in NumPy

class NumpyPPOActing:
    """``numpy_acting``: the actor-critic forward and the sampling in NumPy, from the same torch
    noise, for all sub-envs at once or per sub-env / chunk of ``chunk`` rows; every output stays
    on the host. Plain: the actor and the critic as two forwards over views of their weights.
    Under ``stacked_mlps``: one side-by-side forward, a snapshot per rollout (contiguous weight
    copies; wide acting batches split the block-diagonal layers). ``block_noise``: a rollout's
    sampling uniforms drawn in one call as it starts (``start_rollout``)."""

    def __init__(self, policy: PPOPolicy, probe: Probe, chunk: int, block_noise: bool = False) -> None:
        self.policy, self.probe, self.chunk, self.block_noise = policy, probe, chunk, block_noise
        self.forwards: tuple[NumpyMLP, ...] | None = None
        self.split = 0
        self.noise_block: np.ndarray | None = None  # block_noise: the rollout's sampling uniforms
        self.noise_row = 0

    def drop_snapshot(self) -> None:
        """Forget the NumPy forwards: the weights changed."""
        self.forwards = None

    def start_rollout(self, steps: int) -> None:
        """``block_noise``: every acting draw of a rollout of ``steps`` steps, in one call, in the
        order its steps take them (on the CPU the same numbers as one call per step); plain: none."""
        if not self.block_noise:
            return
        self.noise_block = torch.rand((steps, self.policy.num_envs), generator=self.policy.generator).numpy()
        self.noise_row = 0

    def end_rollout(self) -> None:
        self.noise_block = None  # acting outside a rollout draws as it goes

    def noise(self) -> np.ndarray:
        """This step's sampling noise as a NumPy row: the next row of the rollout's block, or one
        torch call (plain)."""
        block = self.noise_block
        if block is not None and self.noise_row < len(block):
            self.noise_row += 1
            return block[self.noise_row - 1]
        return self.policy.draw().numpy()

    def forward(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(actor output, value) in NumPy, in forwards of ``chunk`` rows."""
        model = self.policy.model
        if self.forwards is None:
            self.forwards = ((NumpyMLP.side_by_side(model.actor, model.critic),) if self.policy.stacked_mlps
                             else (NumpyMLP.of(model.actor), NumpyMLP.of(model.critic)))
            self.split = model.actor[-1].out_features
        if self.policy.stacked_mlps:
            out = host.in_chunks(self.forwards[0], obs, self.chunk)
            return out[:, :self.split], out[:, self.split]
        actor_forward, critic_forward = self.forwards
        return host.in_chunks(actor_forward, obs, self.chunk), host.in_chunks(critic_forward, obs, self.chunk)[:, 0]

    def __call__(self, obs: np.ndarray) -> ActingStep:
        policy = self.policy
        with self.probe.phase("inference"):
            noise = self.noise()
            obs = obs.reshape(policy.num_envs, *policy.obs_shape)
            actor_out, value = self.forward(obs)
            if policy.discrete:
                action, logprob = host.sample_categorical(actor_out, noise)
            else:
                action, logprob = host.sample_gaussian(actor_out, host_view(policy.model.log_std), noise)
        return ActingStep(obs, (action, logprob, value), action)
