"""DQN (reference_trainers/value/dqn.py): TD targets and the Huber loss on hand-computed cases, double
Q-learning's action choice, importance weights, and the trainer's DQN-specific paths."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from value_trainers import make

import reference_trainers.value.dqn as dqn_mod
from reference_trainers.nets.networks import QNetwork
from reference_trainers.value.dqn import DQNTrainer, dqn_targets, td_loss


def test_dqn_targets_bootstrap_from_the_target_networks_max() -> None:
    next_q = torch.tensor([[1.0, 3.0], [-2.0, -1.0], [5.0, 0.0]])
    rewards = torch.tensor([1.0, 0.5, -1.0])
    bootstrap = torch.tensor([0.5, 0.0, 0.25])  # gamma^n, or 0 after a termination
    # 1 + 0.5*3 = 2.5; 0.5 + 0*(-1) = 0.5; -1 + 0.25*5 = 0.25
    assert torch.equal(dqn_targets(next_q, None, rewards, bootstrap), torch.tensor([2.5, 0.5, 0.25]))


def test_double_q_targets_let_the_online_network_choose_the_action() -> None:
    next_q_target = torch.tensor([[1.0, 3.0], [-2.0, -1.0]])
    next_q_online = torch.tensor([[9.0, 0.0], [0.0, 1.0]])  # picks action 0, then action 1
    targets = dqn_targets(next_q_target, next_q_online, torch.zeros(2), torch.ones(2))
    assert torch.equal(targets, torch.tensor([1.0, -1.0]))


def test_td_loss_is_the_huber_loss_with_delta_one() -> None:
    q = torch.tensor([0.0, 0.0, 0.0, 1.0], requires_grad=True)
    targets = torch.tensor([0.5, -2.0, 3.0, 1.0])
    # Huber: 0.5*0.25 = 0.125; |2| - 0.5 = 1.5; |3| - 0.5 = 2.5; 0 -> mean 4.125 / 4
    loss, td = td_loss(q, targets, None)
    assert loss.item() == pytest.approx(4.125 / 4)
    assert torch.equal(td, torch.tensor([0.5, 2.0, 3.0, 0.0]))
    loss.backward()
    torch.testing.assert_close(q.grad, torch.tensor([-0.5, 1.0, -1.0, 0.0]) / 4)  # clipped gradients


def test_td_loss_weights_each_sample_by_its_importance_weight() -> None:
    q, targets = torch.zeros(3), torch.tensor([0.5, -2.0, 3.0])
    weighted, _ = td_loss(q, targets, torch.tensor([1.0, 0.5, 0.0]))
    assert weighted.item() == pytest.approx((0.125 + 0.5 * 1.5 + 0.0) / 3)
    ones, _ = td_loss(q, targets, torch.ones(3))
    assert ones.item() == td_loss(q, targets, None)[0].item()


def test_dqn_trainer_builds_a_q_network_and_a_frozen_target_copy() -> None:
    trainer = make("dqn", "env.id=Acrobot-v1")
    try:
        assert isinstance(trainer, DQNTrainer) and isinstance(trainer.model, QNetwork)
        assert trainer.model.net[-1].out_features == 3 and trainer.obs_dim == 6
        assert all(not p.requires_grad for p in trainer.target.parameters())
        for a, b in zip(trainer.model.parameters(), trainer.target.parameters()):
            assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
        assert trainer.q_values(torch.zeros(5, 6)).shape == (5, 3)
    finally:
        trainer.close()


@pytest.mark.parametrize("double_q", [False, True])
def test_double_q_flag_runs_the_online_network_on_next_states(monkeypatch: pytest.MonkeyPatch, double_q: bool) -> None:
    trainer = make("dqn", f"dqn.double_q={str(double_q).lower()}")
    calls: list[str] = []
    seen: dict[str, Any] = {}
    real = dqn_mod.dqn_targets

    def spy(next_q_target: torch.Tensor, next_q_online: torch.Tensor | None, *rest: torch.Tensor) -> torch.Tensor:
        seen["online"] = next_q_online
        return real(next_q_target, next_q_online, *rest)

    monkeypatch.setattr(dqn_mod, "dqn_targets", spy)
    try:
        for _ in range(3):
            trainer._env_step()
        sample = trainer.replay.sample(8)
        forward = trainer.forward
        trainer.forward = lambda obs: (calls.append("online"), forward(obs))[1]
        trainer.learner.step(*trainer.train_batch(sample))
    finally:
        trainer.close()
    assert calls == (["online", "online"] if double_q else ["online"])
    assert (seen["online"] is not None) is double_q
