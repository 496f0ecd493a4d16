"""DQN (Mnih et al. 2015; CleanRL-style): Huber TD loss against a target network, epsilon-greedy
acting, optional double Q-learning (van Hasselt et al. 2016), n-step returns and prioritized
replay.

Read top to bottom: the pure TD-target and loss functions, then ``DQNTrainer``, which plugs
them into the loop shared with IQN (``value/loop.py``: acting, replay, update
schedule, target network). Every optimisation flag is picked there and in the shared
``Learner``; with every flag plain this is the reference algorithm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reference_trainers.nets import mlp
from reference_trainers.replay.buffers import Sample
from reference_trainers.nets.networks import QNetwork
from reference_trainers.runtime.trainer import train_from_command_line
from reference_trainers.value.loop import ValueTrainer

__all__ = ["DQNTrainer", "dqn_targets", "td_loss"]


# --------------------------------------------------------------------------- pure functions

def dqn_targets(next_q_target: torch.Tensor, next_q_online: torch.Tensor | None, rewards: torch.Tensor,
                bootstrap: torch.Tensor) -> torch.Tensor:
    """TD targets ``r + bootstrap * Q_target(s', a*)`` for a (B, A) batch of next-state values.

    ``a*`` is the target network's argmax, or the online network's with double Q-learning
    (``next_q_online`` given). ``bootstrap`` is ``gamma ** n``, or 0 after a termination.
    """
    if next_q_online is None:
        next_value = next_q_target.max(dim=1).values
    else:
        best = next_q_online.argmax(dim=1, keepdim=True)
        next_value = next_q_target.gather(1, best).squeeze(1)
    return rewards + bootstrap * next_value


def td_loss(q_taken: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Huber (smooth L1, delta 1) TD loss, mean over the batch, importance-weighted under PER.

    Returns (loss, |TD error| per sample).
    """
    per_sample = F.smooth_l1_loss(q_taken, targets, reduction="none", beta=1.0)
    loss = per_sample.mean() if weights is None else (weights * per_sample).mean()
    return loss, (targets - q_taken).detach().abs()


# --------------------------------------------------------------------------- trainer

class DQNTrainer(ValueTrainer):
    """DQN on the shared value-based loop; reads the ``dqn:`` config section."""

    algo = "dqn"

    def build_network(self, obs_shape: tuple[int, ...], num_actions: int) -> nn.Module:
        return QNetwork(obs_shape, num_actions, self.config.model)

    def q_values(self, obs: torch.Tensor, fractions: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward(obs)

    def train_batch(self, sample: Sample) -> tuple[torch.Tensor, ...]:
        batch = (sample.obs, sample.actions, sample.rewards, sample.next_obs, sample.bootstrap)
        return batch if sample.weights is None else (*batch, sample.weights)

    def loss(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
             bootstrap: torch.Tensor, weights: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        with torch.no_grad():
            with self.learner.autocast():
                next_q_target = self.target_forward(next_obs)
                next_q_online = self.forward(next_obs) if self.hp.double_q else None
            targets = dqn_targets(next_q_target.float(), None if next_q_online is None else next_q_online.float(),
                                  rewards, bootstrap)
        with self.learner.autocast():
            q = self.forward(obs)
        q_taken = q.float().gather(1, actions.unsqueeze(1)).squeeze(1)
        loss, td_abs = td_loss(q_taken, targets, weights)
        return loss, {"loss": loss.detach(), "q_values": q_taken.detach().mean(), "priority": td_abs}

    def td_gradient(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
                    bootstrap: torch.Tensor, weights: torch.Tensor | None = None
                    ) -> tuple[list, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """``analytic_grads`` (``value.updates``): forward, TD targets, Huber loss and its gradient
        with respect to the Q-values, no autograd graph: (the forward's saved activations,
        d loss / d Q, loss, stats). The Huber loss's gradient is the TD error clamped to [-1, 1],
        per sample, over the batch (times the importance weights under PER), at the taken action."""
        next_q_target = self.target_forward(next_obs)
        next_q_online = self.forward(next_obs) if self.hp.double_q else None
        targets = dqn_targets(next_q_target, next_q_online, rewards, bootstrap)
        q, saved = mlp.mlp_forward(self.model.net, obs, self.aten_tanh_from)
        taken = actions.unsqueeze(1)
        q_taken = q.gather(1, taken).squeeze(1)
        loss, td_abs = td_loss(q_taken, targets, weights)
        slope = (q_taken - targets).clamp(-1.0, 1.0) / q_taken.shape[0]
        if weights is not None:
            slope = slope * weights
        grad_q = torch.zeros_like(q).scatter_(1, taken, slope.unsqueeze(1))
        return saved, grad_q, loss, {"loss": loss, "q_values": q_taken.mean(), "priority": td_abs}


def main(argv: list[str] | None = None) -> int:
    """Train DQN from a YAML config on its own (no harness): ``python -m reference_trainers.value.dqn``."""
    return train_from_command_line(DQNTrainer, "loss", argv, prog="python -m reference_trainers.value.dqn",
                                   description=main.__doc__, algo="dqn")


if __name__ == "__main__":
    raise SystemExit(main())
