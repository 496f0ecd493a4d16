"""``optimizations.numpy_update``: the hand-written minibatch step of PPO and DQN in NumPy, on the CPU.

``analytic_grads`` removes autograd from a small update, but each of its torch ops still
spends microseconds in dispatch for a few thousand multiply-adds, and torch's CPU tanh kernel
is several times slower than NumPy's on a minibatch's activations. Here the same forward,
loss gradients (``ppo.loss.ppo_loss_grads_numpy``; DQN's Huber TD gradient, ``value.dqn.DQNTrainer.td_gradient``),
backward (``nets.mlp.HostMLP``, the NumPy twin of ``mlp_backward``) and gradient clipping run as NumPy calls on zero-copy
views: the weights (and DQN's target network) are read through views of the parameters, the
gradients are written into views of the learner's flat gradient buffer, and the optimiser
step stays torch's fused Adam kernel. Same maths, other kernels and summation order: the
fp-reorder parity class. Guarded by tests/test_numpy_update.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from reference_trainers.nets.mlp import MLP, HostMLP, NumpyMLP, host_view
from reference_trainers.ppo.loss import ppo_loss_grads_numpy as ppo_loss_grads

STAT_NAMES = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "nonfinite")
"""The statistics a PPO step returns (``ppo.loss.ppo_loss_grads``'s, and the non-finite flag)."""
DQN_STAT_NAMES = ("loss", "q_values", "nonfinite")
"""The 0-d statistics a DQN step returns (``dqn.DQNTrainer.loss``'s, and the non-finite flag)."""


class FlatGradients:
    """The learner's flat gradient buffer as a NumPy view: clipping and the non-finite check."""

    def __init__(self, flat_grad: torch.Tensor, networks: Sequence[HostMLP], max_grad_norm: float | None) -> None:
        self.flat = host_view(flat_grad)
        for layer in (layer for network in networks for layer in network.layers):
            for grad in (layer.weight_grad, layer.bias_grad):
                if not np.shares_memory(grad, self.flat):
                    raise ValueError("numpy_update needs every gradient in the learner's flat buffer")
        self.max_grad_norm = max_grad_norm

    def clip(self, loss: np.floating) -> tuple[np.float32, np.float32]:
        """Clip to ``max_grad_norm`` (``Learner._clip_scale``); (norm before, non-finite flag 0/1)."""
        flat = self.flat
        grad_norm = np.sqrt(flat @ flat)
        if self.max_grad_norm is not None:
            flat *= np.minimum(self.max_grad_norm / (grad_norm + np.float32(1e-6)), np.float32(1.0))
        return grad_norm, np.float32(not (np.isfinite(loss) and np.isfinite(grad_norm)))


def _host(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """A NumPy view of a CPU tensor (an array as it is)."""
    return x if isinstance(x, np.ndarray) else x.numpy()


def _as_tensors(*values: np.floating) -> list[torch.Tensor]:
    """0-d float32 tensors of host scalars (one array, one conversion)."""
    return list(torch.from_numpy(np.array(values, dtype=np.float32)).unbind())


class HostPPOStep:
    """One PPO minibatch's loss, every gradient and their clipping, in NumPy (``numpy_update``).

    Called as the learner's loss closure that clips itself: returns (loss, statistics with
    ``nonfinite``, gradient norm before clipping) as 0-d torch tensors; the gradients are in
    ``flat_grad`` (the parameters' ``.grad``) when it returns."""

    def __init__(self, actor: MLP, critic: MLP, flat_grad: torch.Tensor, max_grad_norm: float | None,
                 clip_coef: float, clip_vloss: bool, ent_coef: float, vf_coef: float, norm_adv: bool) -> None:
        self.actor, self.critic = HostMLP(actor), HostMLP(critic)
        self.grads = FlatGradients(flat_grad, (self.actor, self.critic), max_grad_norm)
        self.coefs = (np.float32(clip_coef), clip_vloss, np.float32(ent_coef), np.float32(vf_coef), norm_adv)

    def __call__(self, obs: torch.Tensor | np.ndarray, *rest: torch.Tensor | np.ndarray
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """``obs``, then actions, old log-probabilities, advantages, returns, old values and the
        mask: CPU tensors, or NumPy arrays (``ppo.minibatches.host_packed_gather``'s column views)."""
        obs_h = np.ascontiguousarray(_host(obs).reshape(len(obs), -1))  # a column view of the packed minibatch
        logits, actor_inputs = self.actor.forward(obs_h)
        value, critic_inputs = self.critic.forward(obs_h)
        scalars, grad_logits, grad_value = ppo_loss_grads(logits, value[:, 0], *(_host(x) for x in rest), *self.coefs)
        self.actor.backward(actor_inputs, grad_logits)
        self.critic.backward(critic_inputs, grad_value[:, None])
        grad_norm, nonfinite = self.grads.clip(scalars[0])
        loss, *stats, norm = _as_tensors(*scalars, nonfinite, grad_norm)
        return loss, dict(zip(STAT_NAMES, stats)), norm


class HostDQNStep:
    """One DQN minibatch's Huber TD loss, the Q-network's gradients and their clipping, in NumPy
    (``numpy_update``; ``value.updates.HandWrittenUpdate``'s maths). The target network (and, with
    double Q-learning, the online one) evaluates the next observations through views of its
    weights. Returns what ``HostPPOStep`` does; ``priority`` is the per-sample |TD error|."""

    def __init__(self, online: MLP, target: MLP, flat_grad: torch.Tensor, max_grad_norm: float | None,
                 double_q: bool) -> None:
        self.online, self.target = HostMLP(online), NumpyMLP.of(target)
        self.online_next = NumpyMLP.of(online) if double_q else None
        self.grads = FlatGradients(flat_grad, (self.online,), max_grad_norm)

    def __call__(self, obs: torch.Tensor | np.ndarray, actions: torch.Tensor | np.ndarray,
                 rewards: torch.Tensor | np.ndarray, next_obs: torch.Tensor | np.ndarray,
                 bootstrap: torch.Tensor | np.ndarray, weights: torch.Tensor | np.ndarray | None = None
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """A minibatch as CPU tensors, or NumPy arrays (``ReplayBuffer.host_gather``'s)."""
        next_obs_h = _host(next_obs)
        next_q = self.target(next_obs_h)
        rows = np.arange(next_q.shape[0])
        if self.online_next is None:
            next_value = next_q.max(axis=1)
        else:  # double Q-learning: the online network picks, the target network values
            next_value = next_q[rows, self.online_next(next_obs_h).argmax(axis=1)]
        targets = _host(rewards) + _host(bootstrap) * next_value
        q, inputs = self.online.forward(np.ascontiguousarray(_host(obs)))
        taken = _host(actions)
        q_taken = q[rows, taken]
        error = q_taken - targets
        size = np.abs(error)
        per_sample = np.where(size < 1.0, 0.5 * error * error, size - 0.5)  # smooth L1, beta 1
        count = np.float32(len(error))  # the means as sum / count: np.mean's sum and division, without its overhead
        slope = np.clip(error, -1.0, 1.0) / count
        if weights is None:
            loss = per_sample.sum() / count
        else:
            weights_h = _host(weights)
            loss = (weights_h * per_sample).sum() / count
            slope *= weights_h
        grad_q = np.zeros_like(q)
        grad_q[rows, taken] = slope
        self.online.backward(inputs, grad_q)
        grad_norm, nonfinite = self.grads.clip(loss)
        loss_t, q_mean, nonfinite_t, norm = _as_tensors(loss, q_taken.sum() / count, nonfinite, grad_norm)
        stats = dict(zip(DQN_STAT_NAMES, (loss_t, q_mean, nonfinite_t)))
        stats["priority"] = torch.from_numpy(size)
        return loss_t, stats, norm
