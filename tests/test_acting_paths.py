"""The shared acting paths (reference_trainers/paths/acting.py): chosen once from the flags for every
trainer, and the batched path taking the same rows, draws and actions as the per-env one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from reference_trainers import build_trainer
from reference_trainers.config.resolve import resolve_config
from reference_trainers.config.schema import build_config
from reference_trainers.nets.mlp import NumpyMLP
from reference_trainers.paths.acting import BatchedActing, PerEnvActing, choose_acting
from reference_trainers.ppo.policy import NumpyPPOActing, PPOPolicy
from reference_trainers.ppo.recurrent import RecurrentPolicy
from reference_trainers.runtime.probe import NullProbe
from reference_trainers.value.acting import EpsilonGreedy, NumpyEpsilonGreedy

TINY = ["device=cpu", "env.num_envs=3", "env.vectorization=serial", "model.hidden_sizes=[16,16]", "run.steps=64"]
TRAINERS = {
    "ppo": ["algo=ppo", "ppo.num_steps=8"],
    "ppo-lstm": ["algo=ppo", "ppo.num_steps=8", "ppo.num_minibatches=1", "model.recurrent=lstm"],
    "dqn": ["algo=dqn"],
    "iqn": ["algo=iqn"],
}
POLICIES = {"ppo": PPOPolicy, "ppo-lstm": RecurrentPolicy, "dqn": EpsilonGreedy, "iqn": EpsilonGreedy}


def _trainer(name: str, *overrides: str) -> Any:
    return build_trainer(resolve_config(build_config({}, [*TINY, *TRAINERS[name], *overrides])))


@pytest.mark.parametrize("name", list(TRAINERS))
@pytest.mark.parametrize("batched, path", [(False, PerEnvActing), (True, BatchedActing)])
def test_every_trainer_acts_through_the_shared_path_its_flag_names(name: str, batched: bool, path: type) -> None:
    trainer = _trainer(name, f"optimizations.batch_inference={str(batched).lower()}",
                       "optimizations.numpy_acting=false")
    try:
        assert type(trainer.act) is path
        assert type(trainer.act.policy) is POLICIES[name]
        actions = trainer.select_actions(trainer.next_obs)
        assert actions.shape[0] == 3
    finally:
        trainer.close()


@pytest.mark.parametrize("name, path", [("ppo", NumpyPPOActing), ("dqn", NumpyEpsilonGreedy)])
def test_numpy_acting_replaces_the_torch_paths(name: str, path: type) -> None:
    trainer = _trainer(name, "optimizations.batch_inference=true", "optimizations.numpy_acting=true")
    try:
        assert type(trainer.act) is path
    finally:
        trainer.close()


class RowPolicy:
    """A toy policy: action = row index + 10 * observation + the row's draw; records the rows of each call."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs, self.calls, self.draws = num_envs, [], 0

    def draw(self) -> torch.Tensor:
        self.draws += 1
        return torch.arange(self.num_envs) * 100

    def inputs(self, obs: np.ndarray, start: int, stop: int, draws: Any) -> tuple[torch.Tensor, ...]:
        return (torch.as_tensor(obs[start:stop], dtype=torch.float32),)

    def __call__(self, inputs: tuple[torch.Tensor, ...], draws: torch.Tensor, start: int, stop: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append((start, stop))
        rows = torch.arange(start, stop)
        return (rows + 10 * inputs[0].long() + draws[start:stop], rows * 2)


@pytest.mark.parametrize("chunk", [None, 1, 2, 5])
def test_batched_and_per_env_paths_take_the_same_rows_draws_and_actions(chunk: int | None) -> None:
    obs = np.arange(5, dtype=np.float32)
    plain, batched = RowPolicy(5), RowPolicy(5)
    one = PerEnvActing(plain, 5, NullProbe())(obs)
    other = BatchedActing(batched, 5, NullProbe(), chunk)(obs)
    np.testing.assert_array_equal(one.host_actions, other.host_actions)
    for a, b in zip(one.outputs, other.outputs):
        assert torch.equal(a, b)
    assert torch.equal(one.obs, other.obs)
    assert plain.draws == batched.draws == 1  # one draw per step, whatever the path
    assert plain.calls == [(i, i + 1) for i in range(5)]
    size = chunk or 5
    assert batched.calls == [(s, min(s + size, 5)) for s in range(0, 5, size)]


def test_choose_acting_prefers_the_numpy_path_then_the_batch_flag() -> None:
    policy, numpy_path = RowPolicy(2), NumpyMLP([(torch.ones(1, 1), torch.zeros(1))])
    assert choose_acting(policy, 2, NullProbe(), True, None, numpy_path) is numpy_path
    assert type(choose_acting(policy, 2, NullProbe(), True, None, None)) is BatchedActing
    assert type(choose_acting(policy, 2, NullProbe(), False, None, None)) is PerEnvActing
