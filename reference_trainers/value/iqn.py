"""IQN, implicit quantile networks (Dabney et al. 2018): the return distribution's quantile
function ``Z_tau(x, a)`` learned at sampled fractions tau with the quantile Huber loss.

N fractions for the online quantiles, N' for the target quantiles, K for risk-neutral
acting and next-action selection (Q = the mean of K sampled quantiles); tau enters the
network through 64 cosine features (``nets/networks.py``).

Read top to bottom: the pure functions (fractions, targets, loss), then ``IQNTrainer``,
which plugs them into the loop shared with DQN (``value/loop.py``). Fractions are
drawn outside the train step and passed in, so the step is deterministic given its inputs
(compiled and CUDA-graphed steps replay the same maths).
"""

from __future__ import annotations

import torch
from torch import nn

from reference_trainers.replay.buffers import Sample
from reference_trainers.config.schema import TrainConfig
from reference_trainers.nets.networks import IQNNetwork
from reference_trainers.runtime.probe import Probe
from reference_trainers.config.resolve import Resolution
from reference_trainers.runtime.trainer import train_from_command_line
from reference_trainers.value.loop import ValueTrainer

__all__ = ["IQNTrainer", "iqn_targets", "quantile_huber_loss", "sample_taus"]


# --------------------------------------------------------------------------- pure functions

def sample_taus(rows: int, count: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """``count`` fractions per row, uniform on [0, 1), float32: shape (rows, count)."""
    return torch.rand(rows, count, generator=generator, device=device)


def iqn_targets(next_quantiles: torch.Tensor, next_q: torch.Tensor, rewards: torch.Tensor,
                bootstrap: torch.Tensor) -> torch.Tensor:
    """Target quantiles ``r + bootstrap * Z_tau'_j(x', a*)``: (B, N', A) quantiles and (B, A)
    selection values -> (B, N'), with ``a* = argmax_a next_q``."""
    best = next_q.argmax(dim=1)
    index = best.view(-1, 1, 1).expand(-1, next_quantiles.shape[1], 1)
    chosen = next_quantiles.gather(2, index).squeeze(2)
    return rewards.unsqueeze(1) + bootstrap.unsqueeze(1) * chosen


def quantile_huber_loss(quantiles: torch.Tensor, targets: torch.Tensor, taus: torch.Tensor, kappa: float,
                        hand_written: bool = False) -> torch.Tensor:
    """Per-sample quantile Huber loss (Dabney et al. 2018, eq. 3; QR-DQN eq. 10).

    ``quantiles`` (B, N) at fractions ``taus`` (B, N), ``targets`` (B, N'). Over all pairs,
    ``delta_ij = target_j - quantile_i`` (B, N, N') and
    ``rho_ij = |tau_i - 1{delta_ij < 0}| * L_kappa(delta_ij) / kappa``; the loss of a sample
    is ``sum_i mean_j rho_ij``. Returns shape (B,); differentiable in ``quantiles`` only.
    Plain: these tensor ops, differentiated by autograd. ``hand_written``
    (``hand_written_quantile_loss``): ``_QuantileHuber``, the same maths with its own backward.
    """
    targets, taus = targets.detach(), taus.detach()
    if hand_written:
        return _QuantileHuber.apply(quantiles, targets, taus, float(kappa))
    delta = targets.unsqueeze(1) - quantiles.unsqueeze(2)                          # (B, N, N')
    size = delta.abs()
    huber = torch.where(size <= kappa, 0.5 * delta.square(), kappa * (size - 0.5 * kappa))
    weight = (taus.unsqueeze(2) - (delta.detach() < 0).float()).abs()
    return (weight * huber).sum(dim=1).mean(dim=1) / kappa


class _QuantileHuber(torch.autograd.Function):
    """The pairwise loss with its gradient written out, in arithmetic ops only.

    With ``s = sign(delta)``: ``|tau - 1{delta < 0}| = 0.5 + s * (tau - 0.5)`` wherever
    ``delta != 0`` (where the Huber term is 0 anyway), and with ``c = min(|delta|, kappa)``:
    ``L_kappa(delta) = c * (|delta| - c / 2)``. The gradient of ``rho`` in ``delta`` is
    ``weight * clamp(delta, -kappa, kappa) / kappa``. Comparisons, masks and ``where`` over
    the (B, N, N') pairs cost several times more than arithmetic on CPU (and autograd would
    save them for the backward); this keeps the pairwise work to a few fused-size passes.
    Guarded by the hand-computed case and the autograd comparison in tests/test_iqn.py.
    """

    @staticmethod
    def forward(ctx, quantiles: torch.Tensor, targets: torch.Tensor, taus: torch.Tensor,  # noqa: ANN001
                kappa: float) -> torch.Tensor:
        delta = targets.unsqueeze(1) - quantiles.unsqueeze(2)                      # (B, N, N')
        weight = torch.sign(delta).mul_((taus - 0.5).unsqueeze(2)).add_(0.5)
        size = delta.abs()
        clipped = size.clamp(max=kappa)
        huber = size.sub_(clipped, alpha=0.5).mul_(clipped)                        # c * (|delta| - c/2)
        ctx.save_for_backward(delta, weight)
        ctx.kappa = kappa
        return huber.mul_(weight).sum(dim=1).mean(dim=1).div_(kappa)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:  # noqa: ANN001
        delta, weight = ctx.saved_tensors
        kappa, pairs = ctx.kappa, delta.shape[2]
        slope = delta.clamp(-kappa, kappa).mul_(weight)                            # d rho / d delta * kappa
        scale = grad_out.div(-kappa * pairs).view(-1, 1)                           # d delta / d quantile = -1
        return slope.sum(dim=2).mul_(scale), None, None, None


# --------------------------------------------------------------------------- trainer

class IQNTrainer(ValueTrainer):
    """IQN on the shared value-based loop; reads the ``iqn:`` config section."""

    algo = "iqn"

    def __init__(self, config: TrainConfig, probe: Probe | None = None, resolution: Resolution | None = None) -> None:
        super().__init__(config, probe=probe, resolution=resolution)
        self.hand_written_loss = bool(self.config.optimizations.hand_written_quantile_loss)

    def build_network(self, obs_shape: tuple[int, ...], num_actions: int) -> nn.Module:
        return IQNNetwork(obs_shape, num_actions, self.config.model, self.hp.quantile_embedding_dim)

    def acting_fractions(self, rows: int) -> torch.Tensor:
        return sample_taus(rows, self.hp.num_quantile_samples, self.tau_generator, self.device)

    def q_values(self, obs: torch.Tensor, fractions: torch.Tensor | None = None) -> torch.Tensor:
        """Risk-neutral Q-values: the mean of K quantiles at the given (else fresh) fractions, per row."""
        taus = self.acting_fractions(obs.shape[0]) if fractions is None else fractions
        return self.forward(obs, taus).mean(dim=1)

    def train_batch(self, sample: Sample) -> tuple[torch.Tensor, ...]:
        hp, rows, gen = self.hp, sample.obs.shape[0], self.update_generator
        taus = sample_taus(rows, hp.num_tau_samples, gen, self.device)
        taus_next = sample_taus(rows, hp.num_tau_prime_samples, gen, self.device)
        taus_select = sample_taus(rows, hp.num_quantile_samples, gen, self.device)
        batch = (sample.obs, sample.actions, sample.rewards, sample.next_obs, sample.bootstrap,
                 taus, taus_next, taus_select)
        return batch if sample.weights is None else (*batch, sample.weights)

    def loss(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
             bootstrap: torch.Tensor, taus: torch.Tensor, taus_next: torch.Tensor, taus_select: torch.Tensor,
             weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        with torch.no_grad():
            with self.learner.autocast():
                next_quantiles = self.target_forward(next_obs, taus_next)
                selector = self.forward if self.hp.double_q else self.target_forward
                next_q = selector(next_obs, taus_select).mean(dim=1)
            targets = iqn_targets(next_quantiles.float(), next_q.float(), rewards, bootstrap)
        with self.learner.autocast():
            quantiles = self.forward(obs, taus)                                       # (B, N, A)
        index = actions.view(-1, 1, 1).expand(-1, quantiles.shape[1], 1)
        taken = quantiles.float().gather(2, index).squeeze(2)                          # (B, N)
        per_sample = quantile_huber_loss(taken, targets, taus, self.hp.kappa, self.hand_written_loss)
        loss = per_sample.mean() if weights is None else (weights * per_sample).mean()
        return loss, {"loss": loss.detach(), "q_values": taken.detach().mean(), "priority": per_sample.detach()}


def main(argv: list[str] | None = None) -> int:
    """Train IQN from a YAML config on its own (no harness): ``python -m reference_trainers.value.iqn``."""
    return train_from_command_line(IQNTrainer, "loss", argv, prog="python -m reference_trainers.value.iqn",
                                   description=main.__doc__, algo="iqn")


if __name__ == "__main__":
    raise SystemExit(main())
