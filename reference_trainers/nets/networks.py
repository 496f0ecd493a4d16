"""Network bodies: the PPO actor-critic, the DQN Q-network and the IQN quantile network (CleanRL initialisation).

``model.body`` picks the torso: ``mlp`` over flat observations, or ``cnn``, the Nature CNN
(Mnih et al. 2015) over (channels, height, width) pixels, shared by actor and critic.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from reference_trainers.config.schema import ModelConfig
from reference_trainers.nets.mlp import MLP, OutputLinear, StackedMLPs, output_linear

__all__ = ["MLP", "OutputLinear", "StackedMLPs", "mlp", "output_linear"]  # the MLP's maths: nets/mlp.py

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def init_layer(layer: nn.Linear | nn.Conv2d, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear | nn.Conv2d:
    """Orthogonal weights, constant bias (as in CleanRL / the PPO implementation details)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden_sizes: list[int], out_dim: int, activation: str, out_std: float,
        init: str = "orthogonal") -> MLP:
    """Linear-activation stack ending in a linear head: orthogonal weights (gain sqrt(2), the head
    ``out_std``) and zero biases, or with ``init="torch_default"`` ``nn.Linear``'s own initialisation
    (as Stable-Baselines3's DQN and CleanRL's DQN leave it)."""
    ortho = init == "orthogonal"
    layers: list[nn.Module] = []
    width = in_dim
    for size in hidden_sizes:
        layer = nn.Linear(width, size)
        layers += [init_layer(layer) if ortho else layer, _ACTIVATIONS[activation]()]
        width = size
    head = OutputLinear(width, out_dim)
    layers.append(init_layer(head, std=out_std) if ortho else head)
    return MLP(*layers)


class NatureCNN(nn.Module):
    """The DQN torso (Mnih et al. 2015): conv 32 8x8/4, 64 4x4/2, 64 3x3/1, each ReLU, then a
    512-unit ReLU layer (``features=512``) or the flat conv output (``features=None``).

    Input (B, C, H, W), uint8 or float32 pixel values in [0, 255]; both are scaled by 1/255
    here, on the device, so uint8 and float32 transfers feed the convolutions identical inputs.
    """

    def __init__(self, in_shape: tuple[int, ...], features: int | None = 512) -> None:
        super().__init__()
        channels, height, width = in_shape
        self.conv = nn.Sequential(
            init_layer(nn.Conv2d(channels, 32, 8, stride=4)), nn.ReLU(),
            init_layer(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            init_layer(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(),
        )
        side = lambda n: ((n - 8) // 4 + 1 - 4) // 2 + 1 - 2  # noqa: E731 - output side after the three convs
        flat = 64 * side(height) * side(width)
        self.fc = nn.Sequential(init_layer(nn.Linear(flat, features)), nn.ReLU()) if features else nn.Identity()
        self.out_dim = features or flat

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(normalise_pixels(obs)))


def normalise_pixels(obs: torch.Tensor) -> torch.Tensor:
    """Pixels in [0, 255] (uint8 or float32) -> float32 in [0, 1]: the network's actual input."""
    return obs.float() / 255.0


def _action_dim(action_space: gym.Space) -> tuple[bool, int]:
    discrete = isinstance(action_space, gym.spaces.Discrete)
    if not discrete and not isinstance(action_space, gym.spaces.Box):
        raise ValueError(f"env.id: action space {action_space} is not supported; accepted: Discrete, Box")
    return discrete, int(action_space.n) if discrete else int(np.prod(action_space.shape))


def _shape(obs_shape: int | tuple[int, ...]) -> tuple[int, ...]:
    return (int(obs_shape),) if isinstance(obs_shape, (int, np.integer)) else tuple(obs_shape)


class ActorCritic(nn.Module):
    """Actor and critic heads; ``forward`` returns (actor output, value) in one call.

    ``body: mlp``: separate actor and critic MLPs over flat observations. ``body: cnn``: one
    Nature CNN torso shared by a linear actor head and a linear critic head (CleanRL's Atari PPO).
    Discrete actions: the actor output is logits. Continuous (Box) actions: the actor output
    is the Gaussian mean and ``log_std`` is a state-independent parameter.
    """

    def __init__(self, obs_shape: int | tuple[int, ...], action_space: gym.Space, config: ModelConfig) -> None:
        super().__init__()
        self.discrete, out_dim = _action_dim(action_space)
        shape = _shape(obs_shape)
        if config.body == "cnn":
            self.torso: nn.Module | None = NatureCNN(shape)
            self.critic = init_layer(OutputLinear(self.torso.out_dim, 1), std=1.0)
            self.actor = init_layer(OutputLinear(self.torso.out_dim, out_dim), std=0.01)
        else:
            self.torso = None
            self.critic = mlp(int(np.prod(shape)), config.hidden_sizes, 1, config.activation, out_std=1.0,
                              init=config.init)
            self.actor = mlp(int(np.prod(shape)), config.hidden_sizes, out_dim, config.activation, out_std=0.01,
                             init=config.init)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.zeros(out_dim))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.torso is not None:
            obs = self.torso(obs)
        return self.actor(obs), self.critic(obs).squeeze(-1)


class QNetwork(nn.Module):
    """DQN: observations to one Q-value per discrete action (an MLP, or the Nature CNN and a linear head)."""

    def __init__(self, obs_shape: int | tuple[int, ...], num_actions: int, config: ModelConfig) -> None:
        super().__init__()
        shape = _shape(obs_shape)
        if config.body == "cnn":
            torso = NatureCNN(shape)
            self.net = nn.Sequential(torso, init_layer(OutputLinear(torso.out_dim, num_actions), std=1.0))
        else:
            self.net = mlp(int(np.prod(shape)), config.hidden_sizes, num_actions, config.activation, out_std=1.0,
                           init=config.init)

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
    and the linear head. ``forward(obs (B, *obs_shape), taus (B, T)) -> quantiles (B, T, actions)``.
    With ``body: cnn``, psi is the Nature CNN's convolutions (3136 features at 84x84) and f
    one 512-unit ReLU layer and the head, as in Dopamine's IQN.
    """

    def __init__(self, obs_shape: int | tuple[int, ...], num_actions: int, config: ModelConfig,
                 embedding_dim: int) -> None:
        super().__init__()
        shape = _shape(obs_shape)
        if config.body == "cnn":
            self.psi: nn.Module = NatureCNN(shape, features=None)
            width = self.psi.out_dim
            sizes, split, activation = [512], 0, "relu"
        else:
            activation = config.activation
            sizes = config.hidden_sizes
            split = max(1, len(sizes) - 1)
            psi_layers: list[nn.Module] = []
            width = int(np.prod(shape))
            for size in sizes[:split]:
                psi_layers += [init_layer(nn.Linear(width, size)), _ACTIVATIONS[config.activation]()]
                width = size
            self.psi = nn.Sequential(*psi_layers)
        self.embedding_dim = embedding_dim
        self.phi = init_layer(nn.Linear(embedding_dim, width))
        self.f = mlp(width, sizes[split:], num_actions, activation, out_std=1.0)

    def forward(self, obs: torch.Tensor, taus: torch.Tensor) -> torch.Tensor:
        state = self.psi(obs)                                                        # (B, d)
        tau = torch.relu(self.phi(cosine_embedding(taus, self.embedding_dim)))      # (B, T, d)
        return self.f(state.unsqueeze(1) * tau)                                      # (B, T, A)


class RecurrentCore(nn.Module):
    """An MLP encoder then an LSTM or GRU cell; its state is one tensor (B, k, H): k = 2 for
    the LSTM (hidden and cell), 1 for the GRU. The output of a step is the hidden row."""

    def __init__(self, obs_dim: int, config: ModelConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for size in config.hidden_sizes:
            layers += [init_layer(nn.Linear(width, size)), _ACTIVATIONS[config.activation]()]
            width = size
        self.encoder = nn.Sequential(*layers)
        self.kind, self.hidden = config.recurrent, config.recurrent_size
        self.rows = 2 if self.kind == "lstm" else 1
        self.cell = (nn.LSTMCell if self.kind == "lstm" else nn.GRUCell)(width, self.hidden)
        for name, param in self.cell.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0.0)
            else:
                nn.init.orthogonal_(param, 1.0)

    def step(self, features: torch.Tensor, state: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """One time step from encoded ``features``; the state is zeroed first where ``starts`` is 1."""
        state = state * (1.0 - starts).view(-1, 1, 1).to(state.dtype)
        if self.kind == "lstm":
            h, c = self.cell(features, (state[:, 0].to(features.dtype), state[:, 1].to(features.dtype)))
            return torch.stack([h, c], dim=1).float()
        return self.cell(features, state[:, 0].to(features.dtype)).unsqueeze(1).float()

    def unroll(self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """(T, B, d) observations -> hidden rows (T * B, H); the encoder runs once over all rows."""
        steps, batch = obs.shape[:2]
        features = self.encoder(obs.flatten(0, 1)).view(steps, batch, -1)
        hidden = []
        for t in range(steps):
            state = self.step(features[t], state, starts[t])
            hidden.append(state[:, 0])
        return torch.stack(hidden).flatten(0, 1)


class RecurrentActorCritic(nn.Module):
    """Recurrent PPO: separate actor and critic cores (``RecurrentCore``), each with its head,
    as the feed-forward ``ActorCritic`` keeps separate networks.

    One call is one time step for a batch of sub-envs: ``forward(obs (B, d), state, starts (B,))
    -> (actor output, value, new state)``; where ``starts`` is 1 the state is zeroed first (the
    observation opens an episode). ``state`` is one tensor (B, 2, k, H): actor and critic, k
    rows each (see ``RecurrentCore``). Given a (T, B, d) sequence and (T, B) starts, the call
    is ``unroll``: it replays the sequence from its initial state for truncated
    back-propagation through time (returning that initial state third).
    """

    def __init__(self, obs_dim: int, action_space: gym.Space, config: ModelConfig) -> None:
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if not self.discrete and not isinstance(action_space, gym.spaces.Box):
            raise ValueError(f"env.id: action space {action_space} is not supported; accepted: Discrete, Box")
        out_dim = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        self.actor_core, self.critic_core = RecurrentCore(obs_dim, config), RecurrentCore(obs_dim, config)
        self.actor = init_layer(OutputLinear(config.recurrent_size, out_dim), std=0.01)
        self.critic = init_layer(OutputLinear(config.recurrent_size, 1), std=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.zeros(out_dim))

    def initial_state(self, batch: int, device: torch.device) -> torch.Tensor:
        """Zeros of shape (batch, 2, k, H)."""
        core = self.actor_core
        return torch.zeros(batch, 2, core.rows, core.hidden, device=device)

    def forward(self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if obs.dim() == 3:  # a (T, B, d) sequence: the update's unroll, through the same call (DDP hooks in here)
            actor_out, values = self.unroll(obs, state, starts)
            return actor_out, values, state
        actor_state = self.actor_core.step(self.actor_core.encoder(obs), state[:, 0], starts)
        critic_state = self.critic_core.step(self.critic_core.encoder(obs), state[:, 1], starts)
        value = self.critic(critic_state[:, 0]).squeeze(-1)
        return self.actor(actor_state[:, 0]), value, torch.stack([actor_state, critic_state], dim=1)

    def unroll(self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(T, B, d) observations from ``state`` -> actor output (T, B, .) and values (T, B)."""
        steps, batch = obs.shape[:2]
        actor_out = self.actor(self.actor_core.unroll(obs, state[:, 0], starts))
        values = self.critic(self.critic_core.unroll(obs, state[:, 1], starts))
        return actor_out.view(steps, batch, -1), values.view(steps, batch)
