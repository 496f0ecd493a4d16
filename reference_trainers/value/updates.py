"""The value trainers' update paths: how one minibatch becomes gradients, chosen once per run
(``choose_update``).

- ``AutogradUpdate`` (plain): the algorithm's ``loss`` (DQN's TD loss, IQN's quantile loss); the
  learner runs autograd's backward.
- ``HandWrittenUpdate`` (``analytic_grads``, DQN): the algorithm's ``td_gradient`` (forward, TD
  targets, Huber loss and its gradient at the taken actions) carried through the MLP by
  ``mlp_backward``: every gradient set by hand, no autograd graph.
- ``CompiledHandWrittenUpdate`` (``analytic_grads`` with ``compile_train_step``): the same maths as
  one pure function compiled whole, clipping included; under ``gather_in_step`` it takes the drawn
  replay indices and gathers its minibatch itself (one call per update).
- ``NumpyUpdate`` (``numpy_update``): the hand-written step in NumPy (``paths.numpy_update.HostDQNStep``),
  on minibatches gathered as NumPy arrays.

Each is the learner's loss closure (``paths.learner.Learner``), bound to it once as it is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from reference_trainers.config.schema import OptimizationsConfig
from reference_trainers.nets import mlp
from reference_trainers.paths.learner import UpdatePath
from reference_trainers.paths.numpy_update import HostDQNStep
from reference_trainers.paths.speedups import hand_written_step
from reference_trainers.replay.buffers import Sample

if TYPE_CHECKING:
    from reference_trainers.paths.learner import Learner
    from reference_trainers.value.loop import ValueTrainer

__all__ = ["AutogradUpdate", "CompiledHandWrittenUpdate", "HandWrittenUpdate", "NumpyUpdate", "ValueUpdatePath",
           "choose_update"]

Batch = tuple[torch.Tensor, ...]


class ValueUpdatePath(UpdatePath):
    """An update path of a value trainer, and where its minibatches come from."""

    gathers_in_step = False    # it takes drawn replay indices and gathers the minibatch itself
    host_minibatches = False   # its minibatches are gathered as NumPy arrays (where replay is host memory)
    trainer: ValueTrainer


class AutogradUpdate(ValueUpdatePath):
    """Plain: the algorithm's ``loss``; the learner adds backward, clipping and the step."""

    def __call__(self, *batch: torch.Tensor) -> Batch:
        return self.trainer.loss(*batch)


class HandWrittenUpdate(ValueUpdatePath):
    """``analytic_grads``: the algorithm's ``td_gradient`` with every parameter's gradient set by
    ``mlp_backward`` (no autograd graph); the learner adds clipping and the step."""

    sets_grads = True

    def __call__(self, *batch: torch.Tensor) -> Batch:
        with torch.no_grad():
            saved, grad_q, loss, stats = self.trainer.td_gradient(*batch)
            mlp.mlp_backward(saved, grad_q)
        return loss, stats


class CompiledHandWrittenUpdate(HandWrittenUpdate):
    """``analytic_grads`` under ``compile_train_step``: ``grads`` (or ``grads_at`` under
    ``gather_in_step``) compiled whole; its flat gradients are copied into the learner's
    (``Learner.adopt``)."""

    def __init__(self, trainer: ValueTrainer, cpp_wrapper: bool, gathers_in_step: bool) -> None:
        super().__init__(trainer)
        self.gathers_in_step = gathers_in_step
        self.compiled = hand_written_step(self.grads_at if gathers_in_step else self.grads, cpp_wrapper=cpp_wrapper)
        self.learner: Learner | None = None

    def bind(self, learner: Learner) -> None:
        self.learner = learner

    def grads(self, *batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """A pure function for ``torch.compile``: (loss, stats, every gradient as one flat vector in
        the Q-network's parameter order, clipped, and their norm)."""
        saved, grad_q, loss, stats = self.trainer.td_gradient(*batch)
        flat = torch.cat([g.reshape(-1) for g in mlp.mlp_grads(saved, grad_q)])
        flat, grad_norm, nonfinite = self.learner.clipped(flat, loss)
        return loss, {**stats, "nonfinite": nonfinite}, flat, grad_norm

    def grads_at(self, indices: torch.Tensor, weights: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """``grads`` of the minibatch at replay ``indices``, gathered from the tensor replay's rows
        inside the compiled step (no gather, slices and action cast beside it)."""
        trainer = self.trainer
        sample = Sample(*trainer.replay.storage.gather(indices), weights, indices)
        return self.grads(*trainer.train_batch(sample))

    def __call__(self, *batch: torch.Tensor) -> Batch:
        with torch.no_grad():
            return self.learner.adopt(*self.compiled(*batch))


class NumpyUpdate(ValueUpdatePath):
    """``numpy_update``: ``HandWrittenUpdate``'s maths as NumPy calls over views of the online and
    target networks' weights, writing into the learner's flat gradients (DQN)."""

    sets_grads = True
    host_minibatches = True

    def __init__(self, trainer: ValueTrainer) -> None:
        super().__init__(trainer)
        self.step: HostDQNStep | None = None

    def bind(self, learner: Learner) -> None:
        trainer = self.trainer
        self.step = HostDQNStep(trainer.model.net, trainer.target.net, learner.flat_grad,
                                trainer.config.stability.max_grad_norm, trainer.hp.double_q)

    def __call__(self, *batch: torch.Tensor) -> Batch:
        return self.step(*batch)


def choose_update(trainer: ValueTrainer, o: OptimizationsConfig) -> ValueUpdatePath:
    """The update path the resolved flags name (the registry has checked their combination)."""
    if o.numpy_update:
        return NumpyUpdate(trainer)
    if o.analytic_grads and o.compile_train_step:
        return CompiledHandWrittenUpdate(trainer, cpp_wrapper=bool(o.compile_cpp_wrapper),
                                         gathers_in_step=bool(o.gather_in_step))
    if o.analytic_grads:
        return HandWrittenUpdate(trainer)
    return AutogradUpdate(trainer)
