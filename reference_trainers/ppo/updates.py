"""PPO's update paths: how one minibatch becomes gradients, chosen once per run (``choose_update``).

- ``AutogradUpdate`` (plain): the trainer's ``minibatch_loss`` (the actor-critic's torch forward
  and ``ppo_loss``); the learner runs autograd's backward.
- ``HandWrittenUpdate`` (``analytic_grads``): the MLPs' forward with saved activations,
  ``ppo_loss_grads`` and ``mlp_backward``: every gradient set by hand, no autograd graph.
- ``CompiledHandWrittenUpdate`` (``analytic_grads`` with ``compile_train_step``): the same maths as
  one pure function compiled whole, gradient clipping included.
- ``NumpyUpdate`` (``numpy_update``): the hand-written step in NumPy (``paths.numpy_update.HostPPOStep``).

Each is the learner's loss closure (``paths.learner.Learner``): the learner calls ``bind`` once as
it is built, then the path once per minibatch. ``sets_grads``: the path writes the gradients itself.
"""

from __future__ import annotations

import functools
from dataclasses import asdict
from typing import TYPE_CHECKING

import torch

from reference_trainers.config.schema import OptimizationsConfig
from reference_trainers.nets import mlp
from reference_trainers.paths.learner import UpdatePath
from reference_trainers.paths.numpy_update import HostPPOStep
from reference_trainers.paths.speedups import hand_written_step
from reference_trainers.ppo.loss import ppo_loss_grads

if TYPE_CHECKING:
    from reference_trainers.paths.learner import Learner
    from reference_trainers.ppo.trainer import PPOTrainer

__all__ = ["AutogradUpdate", "CompiledHandWrittenUpdate", "HandWrittenUpdate", "NumpyUpdate", "PPOUpdatePath",
           "choose_update"]

Batch = tuple[torch.Tensor, ...]


class PPOUpdatePath(UpdatePath):
    """An update path of a PPO trainer."""

    trainer: PPOTrainer


class AutogradUpdate(PPOUpdatePath):
    """Plain: the trainer's ``minibatch_loss``; the learner adds backward, clipping and the step."""

    def __call__(self, *batch: torch.Tensor) -> Batch:
        return self.trainer.minibatch_loss(*batch)


class HandWrittenUpdate(PPOUpdatePath):
    """``analytic_grads``: the PPO loss of one minibatch with every parameter's gradient set by
    hand (no autograd graph); the learner adds clipping and the step."""

    sets_grads = True

    def __init__(self, trainer: PPOTrainer) -> None:
        super().__init__(trainer)
        self.loss_grads = functools.partial(ppo_loss_grads, cfg=trainer.loss_coefs)

    def forwards(self, obs: torch.Tensor) -> tuple[torch.Tensor, list, torch.Tensor, list]:
        """Actor logits and critic values with the activations their backward needs."""
        model, tanh_from = self.trainer.model, self.trainer.aten_tanh_from
        logits, actor_saved = mlp.mlp_forward(model.actor, obs, tanh_from)
        value, critic_saved = mlp.mlp_forward(model.critic, obs, tanh_from)
        return logits, actor_saved, value, critic_saved

    def __call__(self, obs: torch.Tensor, *rest: torch.Tensor) -> Batch:
        with torch.no_grad():
            logits, actor_saved, value, critic_saved = self.forwards(obs)
            loss, stats, grad_logits, grad_value = self.loss_grads(logits, value.squeeze(-1), *rest)
            mlp.mlp_backward(actor_saved, grad_logits)
            mlp.mlp_backward(critic_saved, grad_value.unsqueeze(-1))
        return loss, stats


class CompiledHandWrittenUpdate(HandWrittenUpdate):
    """``analytic_grads`` under ``compile_train_step``: ``grads`` compiled whole (no autograd in it),
    clipping included; its flat gradients are copied into the learner's (``Learner.adopt``)."""

    def __init__(self, trainer: PPOTrainer, cpp_wrapper: bool) -> None:
        super().__init__(trainer)
        self.compiled = hand_written_step(self.grads, cpp_wrapper=cpp_wrapper)
        self.learner: Learner | None = None
        self.grad_order: list[int] = []

    def bind(self, learner: Learner) -> None:
        model = self.trainer.model
        networks = list(model.actor.parameters()) + list(model.critic.parameters())
        # the learner's parameter order, as positions in the actor-then-critic order of ``mlp_grads``
        self.grad_order = [next(i for i, q in enumerate(networks) if q is p) for p in learner.params]
        self.learner = learner

    def grads(self, obs: torch.Tensor, *rest: torch.Tensor
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """A pure function for ``torch.compile``: (loss, stats, every gradient as one flat vector in
        the learner's parameter order, clipped, and their norm)."""
        logits, actor_saved, value, critic_saved = self.forwards(obs)
        loss, stats, grad_logits, grad_value = self.loss_grads(logits, value.squeeze(-1), *rest)
        grads = mlp.mlp_grads(actor_saved, grad_logits) + mlp.mlp_grads(critic_saved, grad_value.unsqueeze(-1))
        flat = torch.cat([grads[i].reshape(-1) for i in self.grad_order])
        flat, grad_norm, nonfinite = self.learner.clipped(flat, loss)
        return loss, {**stats, "nonfinite": nonfinite}, flat, grad_norm

    def __call__(self, *batch: torch.Tensor) -> Batch:
        with torch.no_grad():
            return self.learner.adopt(*self.compiled(*batch))


class NumpyUpdate(PPOUpdatePath):
    """``numpy_update``: the hand-written step in NumPy over views of the actor's and critic's
    weights, writing into the learner's flat gradients (and clipping them)."""

    sets_grads = True

    def __init__(self, trainer: PPOTrainer) -> None:
        super().__init__(trainer)
        self.step: HostPPOStep | None = None

    def bind(self, learner: Learner) -> None:
        trainer = self.trainer
        self.step = HostPPOStep(trainer.model.actor, trainer.model.critic, learner.flat_grad,
                                trainer.config.stability.max_grad_norm, **asdict(trainer.loss_coefs))

    def __call__(self, *batch: torch.Tensor) -> Batch:
        return self.step(*batch)


def choose_update(trainer: PPOTrainer, o: OptimizationsConfig) -> PPOUpdatePath:
    """The update path the resolved flags name (the registry has checked their combination)."""
    if o.numpy_update:
        return NumpyUpdate(trainer)
    if o.analytic_grads and o.compile_train_step:
        return CompiledHandWrittenUpdate(trainer, cpp_wrapper=bool(o.compile_cpp_wrapper))
    if o.analytic_grads:
        return HandWrittenUpdate(trainer)
    return AutogradUpdate(trainer)
