"""Network bodies: the PPO actor-critic, the DQN Q-network and the IQN quantile network (CleanRL initialisation)."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from .config import ModelConfig

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def init_layer(layer: nn.Linear, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights, constant bias (as in CleanRL / the PPO implementation details)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden_sizes: list[int], out_dim: int, activation: str, out_std: float) -> nn.Sequential:
    """Linear-activation stack ending in a linear head initialised with ``out_std``."""
    layers: list[nn.Module] = []
    width = in_dim
    for size in hidden_sizes:
        layers += [init_layer(nn.Linear(width, size)), _ACTIVATIONS[activation]()]
        width = size
    layers.append(init_layer(nn.Linear(width, out_dim), std=out_std))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs; ``forward`` returns (actor output, value) in one call.

    Discrete actions: the actor output is logits. Continuous (Box) actions: the actor output
    is the Gaussian mean and ``log_std`` is a state-independent parameter.
    """

    def __init__(self, obs_dim: int, action_space: gym.Space, config: ModelConfig) -> None:
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if not self.discrete and not isinstance(action_space, gym.spaces.Box):
            raise ValueError(f"env.id: action space {action_space} is not supported; accepted: Discrete, Box")
        out_dim = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        self.critic = mlp(obs_dim, config.hidden_sizes, 1, config.activation, out_std=1.0)
        self.actor = mlp(obs_dim, config.hidden_sizes, out_dim, config.activation, out_std=0.01)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.zeros(out_dim))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor(obs), self.critic(obs).squeeze(-1)


class QNetwork(nn.Module):
    """DQN: an MLP from observations to one Q-value per discrete action."""

    def __init__(self, obs_dim: int, num_actions: int, config: ModelConfig) -> None:
        super().__init__()
        self.net = mlp(obs_dim, config.hidden_sizes, num_actions, config.activation, out_std=1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


def cosine_embedding(taus: torch.Tensor, dim: int) -> torch.Tensor:
    """IQN's tau features (Dabney et al. 2018, eq. 4): ``cos(pi * i * tau)`` for i = 0..dim-1.

    Shape ``(..., T) -> (..., T, dim)``; float32 in, float32 out.
    """
    i = torch.arange(dim, dtype=taus.dtype, device=taus.device)
    return torch.cos(math.pi * i * taus.unsqueeze(-1))


class IQNNetwork(nn.Module):
    """IQN: ``Z_tau(x, a) = f(psi(x) * phi(tau))_a`` (Dabney et al. 2018, section 3).

    psi: the hidden layers but the last (at least one) embed the state; phi: a linear layer
    with ReLU over ``cosine_embedding(tau)``, to psi's width; f: the remaining hidden layers
    and the linear head. ``forward(obs (B, obs_dim), taus (B, T)) -> quantiles (B, T, actions)``.
    """

    def __init__(self, obs_dim: int, num_actions: int, config: ModelConfig, embedding_dim: int) -> None:
        super().__init__()
        sizes = config.hidden_sizes
        split = max(1, len(sizes) - 1)
        psi_layers: list[nn.Module] = []
        width = obs_dim
        for size in sizes[:split]:
            psi_layers += [init_layer(nn.Linear(width, size)), _ACTIVATIONS[config.activation]()]
            width = size
        self.psi = nn.Sequential(*psi_layers)
        self.embedding_dim = embedding_dim
        self.phi = init_layer(nn.Linear(embedding_dim, width))
        self.f = mlp(width, sizes[split:], num_actions, config.activation, out_std=1.0)

    def forward(self, obs: torch.Tensor, taus: torch.Tensor) -> torch.Tensor:
        state = self.psi(obs)                                                        # (B, d)
        tau = torch.relu(self.phi(cosine_embedding(taus, self.embedding_dim)))      # (B, T, d)
        return self.f(state.unsqueeze(1) * tau)                                      # (B, T, A)
