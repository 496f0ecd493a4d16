"""Every network's output layer runs in float32 under autocast; the layers before it do not."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import pytest
import torch
from torch import nn

from matmul_dtypes import MatmulDtypes
from reference_trainers.config.schema import ModelConfig
from reference_trainers.nets.networks import (
    ActorCritic,
    IQNNetwork,
    OutputLinear,
    QNetwork,
    RecurrentActorCritic,
)

MLP = ModelConfig(body="mlp", hidden_sizes=[16, 16])
CNN = ModelConfig(body="cnn")
PIXELS = (4, 84, 84)
TWO_ACTIONS = gym.spaces.Discrete(2)


def bf16_autocast() -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16)


def test_output_linear_keeps_q_values_that_bfloat16_would_tie() -> None:
    """Q-values 100.0 and 100.1: bfloat16 rounds both to 100 (argmax picks action 0); float32 keeps them apart."""
    weights, bias = torch.tensor([[1.0], [1.0]]), torch.tensor([0.0, 0.1])
    plain, head = nn.Linear(1, 2), OutputLinear(1, 2)
    for layer in (plain, head):
        layer.weight.data.copy_(weights)
        layer.bias.data.copy_(bias)
    x = torch.tensor([[100.0]])
    with bf16_autocast():
        tied, kept = plain(x), head(x)
    assert tied.dtype == torch.bfloat16 and tied[0, 0] == tied[0, 1]
    assert kept.dtype == torch.float32 and kept.argmax(-1).item() == 1
    torch.testing.assert_close(kept, head(x))  # the same float32 result with autocast off


def _q(net: nn.Module, obs: torch.Tensor) -> torch.Tensor:
    return net(obs)


def _iqn(net: nn.Module, obs: torch.Tensor) -> torch.Tensor:
    return net(obs, torch.rand(obs.shape[0], 3))


NETWORKS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], Callable[[nn.Module, torch.Tensor], object]]] = {
    "dqn-mlp": (lambda: QNetwork((4,), 2, MLP), (4,), _q),
    "dqn-cnn": (lambda: QNetwork(PIXELS, 2, CNN), PIXELS, _q),
    "iqn-mlp": (lambda: IQNNetwork((4,), 2, MLP, 8), (4,), _iqn),
    "iqn-cnn": (lambda: IQNNetwork(PIXELS, 2, CNN, 8), PIXELS, _iqn),
    "ppo-mlp": (lambda: ActorCritic((4,), TWO_ACTIONS, MLP), (4,), lambda net, obs: net(obs)),
    "ppo-cnn": (lambda: ActorCritic(PIXELS, TWO_ACTIONS, CNN), PIXELS, lambda net, obs: net(obs)),
    "ppo-lstm": (lambda: RecurrentActorCritic(4, TWO_ACTIONS, ModelConfig(recurrent="lstm", recurrent_size=8)), (4,),
                 lambda net, obs: net(obs, net.initial_state(obs.shape[0], torch.device("cpu")),
                                      torch.zeros(obs.shape[0]))[:2]),
}


@pytest.mark.parametrize("name", list(NETWORKS))
def test_outputs_are_float32_under_bf16_autocast_while_hidden_layers_are_not(name: str) -> None:
    build, obs_shape, call = NETWORKS[name]
    net = build()
    obs = torch.rand(2, *obs_shape) * (255 if len(obs_shape) == 3 else 1)
    with torch.no_grad(), bf16_autocast(), MatmulDtypes() as seen:
        outputs = call(net, obs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    assert all(out.dtype == torch.float32 for out in outputs)
    assert seen.dtypes == {torch.bfloat16, torch.float32}  # hidden layers in bf16, output layers in float32
