"""The PPO loss (Schulman et al. 2017), its three backends side by side:

- ``ppo_loss``: the clipped surrogate, (clipped) value loss and entropy bonus as torch ops, differentiated by
  autograd (the plain path);
- ``ppo_loss_grads``: the same loss of categorical logits with its gradient derived by hand, in torch
  (``optimizations.analytic_grads``);
- ``ppo_loss_grads_numpy``: that hand-written gradient in NumPy (``optimizations.numpy_update``).

Agreement with autograd: tests/test_analytic.py (torch) and tests/test_numpy_update.py (NumPy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from reference_trainers.paths.numpy_acting import row_max, row_sums, taken_index

__all__ = ["PPOLossCoefs", "ppo_loss", "ppo_loss_grads", "ppo_loss_grads_numpy"]


@dataclass(frozen=True)
class PPOLossCoefs:
    """The loss's coefficients (``ppo.*`` of the config)."""

    clip_coef: float
    clip_vloss: bool
    ent_coef: float
    vf_coef: float
    norm_adv: bool


# --------------------------------------------------------------------------- autograd (plain)

def ppo_loss(new_logprob: torch.Tensor, entropy: torch.Tensor, new_value: torch.Tensor, old_logprob: torch.Tensor,
             advantages: torch.Tensor, returns: torch.Tensor, old_value: torch.Tensor, mask: torch.Tensor,
             cfg: PPOLossCoefs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate + (clipped) value loss - entropy bonus, averaged over valid samples."""
    count = mask.sum().clamp_min(1.0)
    masked_mean = lambda x: (x * mask).sum() / count  # noqa: E731
    if cfg.norm_adv:  # per minibatch, with Bessel's correction (torch's std, as CleanRL and SB3)
        mean = masked_mean(advantages)
        std = torch.sqrt(((advantages - mean) ** 2 * mask).sum() / (count - 1.0).clamp_min(1.0))
        advantages = (advantages - mean) / (std + 1e-8)
    log_ratio = new_logprob - old_logprob
    ratio = log_ratio.exp()
    pg_loss = masked_mean(torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)))
    if cfg.clip_vloss:
        clipped = old_value + (new_value - old_value).clamp(-cfg.clip_coef, cfg.clip_coef)
        v_loss = 0.5 * masked_mean(torch.max((new_value - returns) ** 2, (clipped - returns) ** 2))
    else:
        v_loss = 0.5 * masked_mean((new_value - returns) ** 2)
    entropy_loss = masked_mean(entropy)
    loss = pg_loss - cfg.ent_coef * entropy_loss + cfg.vf_coef * v_loss
    with torch.no_grad():
        stats = {
            "policy_loss": pg_loss.detach(), "value_loss": v_loss.detach(), "entropy": entropy_loss.detach(),
            "approx_kl": masked_mean((ratio - 1) - log_ratio),
            "clip_fraction": masked_mean(((ratio - 1.0).abs() > cfg.clip_coef).float()),
        }
    return loss, stats


# --------------------------------------------------------------------------- by hand, in torch (analytic_grads)

def _max_share(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The share of the gradient of ``torch.max(a, b)`` that goes to ``a``: 1, 0, or 1/2 at a tie (as in autograd)."""
    return (torch.sign(a - b) + 1.0) * 0.5


def _clamp_passes(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Where ``clamp(x, low, high)`` passes the gradient: inside the range, bounds included."""
    return (x >= low) & (x <= high)


def ppo_loss_grads(actor_out: torch.Tensor, new_value: torch.Tensor, actions: torch.Tensor, old_logprob: torch.Tensor,
                   advantages: torch.Tensor, returns: torch.Tensor, old_value: torch.Tensor, mask: torch.Tensor,
                   cfg: PPOLossCoefs) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """``ppo_loss`` of categorical logits, and its gradient with respect to the logits and the
    values, derived by hand (``analytic_grads``); returns (loss, stats, d loss/d logits, d loss/d values).

    The same maths as ``ppo_loss`` + ``evaluate_actions`` under autograd, with fewer ops: the
    masked means are one matrix-vector product with ``mask / count``, and each ``max``/``clamp``
    pair's gradient is one share (ties split in half, clamp bounds included, as autograd does).
    Agreement with autograd: tests/test_analytic.py."""
    count = mask.sum().clamp_min(1.0)
    weight = mask / count  # masked_mean(x) = x . weight
    if cfg.norm_adv:  # Bessel-corrected, as in ppo_loss
        centered = advantages - advantages.dot(weight)
        advantages = centered / ((centered.square().dot(mask) / (count - 1.0).clamp_min(1.0)).sqrt() + 1e-8)
    log_probs = F.log_softmax(actor_out, dim=-1)
    probs = log_probs.exp()
    taken = actions.long().unsqueeze(-1)
    log_ratio = log_probs.gather(-1, taken).squeeze(-1) - old_logprob
    ratio = log_ratio.exp()
    low, high = 1 - cfg.clip_coef, 1 + cfg.clip_coef
    neg_adv = -advantages
    unclipped, clipped = neg_adv * ratio, neg_adv * ratio.clamp(low, high)
    value_error = new_value - returns
    if cfg.clip_vloss:
        value_step = new_value - old_value
        clipped_error = old_value + value_step.clamp(-cfg.clip_coef, cfg.clip_coef) - returns
        squared, clipped_squared = value_error.square(), clipped_error.square()
        value_terms = torch.maximum(squared, clipped_squared)
    else:
        value_terms = value_error.square()
    ratio_step = ratio - 1.0
    terms = torch.stack([torch.maximum(unclipped, clipped), value_terms, -(probs * log_probs).sum(-1),
                         ratio_step - log_ratio, (ratio_step.abs() > cfg.clip_coef).float()])
    pg_loss, value_sum, entropy_loss, approx_kl, clip_fraction = terms.mv(weight).unbind()
    v_loss = 0.5 * value_sum
    loss = pg_loss - cfg.ent_coef * entropy_loss + cfg.vf_coef * v_loss

    # policy: the max's share to the unclipped side, else the clamp's pass-through, then exp
    share = torch.where(_clamp_passes(ratio, low, high), 1.0, _max_share(unclipped, clipped))
    grad_logprob = weight * neg_adv * share * ratio
    # entropy -(p * log p).sum(-1) with p = exp(log p): d/d log p = -p * (1 + log p) per unit of entropy
    grad_log_probs = (log_probs + 1.0) * probs * (weight * cfg.ent_coef).unsqueeze(-1)
    grad_log_probs = grad_log_probs.scatter_add(-1, taken, grad_logprob.unsqueeze(-1))
    grad_logits = grad_log_probs - probs * grad_log_probs.sum(-1, keepdim=True)  # log_softmax backward
    # value: 0.5 * vf_coef * mean of the (clipped) squared error; d (e^2) = 2e
    if cfg.clip_vloss:
        share_v = _max_share(squared, clipped_squared)
        passes = _clamp_passes(value_step, -cfg.clip_coef, cfg.clip_coef)
        slope = share_v * value_error + (1.0 - share_v) * clipped_error * passes
    else:
        slope = value_error
    grad_value = slope * (weight * cfg.vf_coef)
    stats = {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy_loss, "approx_kl": approx_kl,
             "clip_fraction": clip_fraction}
    return loss, stats, grad_logits, grad_value


# --------------------------------------------------------------------------- by hand, in NumPy (numpy_update)

def _max_share_numpy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``_max_share`` in NumPy: 1, 0, or 1/2 at a tie."""
    return (np.sign(a - b) + 1.0) * 0.5


def ppo_loss_grads_numpy(logits: np.ndarray, value: np.ndarray, actions: np.ndarray, old_logprob: np.ndarray,
                   advantages: np.ndarray, returns: np.ndarray, old_value: np.ndarray, mask: np.ndarray,
                   clip_coef: float, clip_vloss: bool, ent_coef: float, vf_coef: float, norm_adv: bool
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``ppo_loss_grads`` in NumPy (``numpy_update``): (loss then the statistics of ``STAT_NAMES`` but the last,
    as one float32 array; d loss / d logits; d loss / d values)."""
    count = max(mask.sum(), np.float32(1.0))
    weight = mask / count
    if norm_adv:  # Bessel-corrected, as in ppo_loss
        centered = advantages - advantages @ weight
        advantages = centered / (np.sqrt((centered * centered) @ mask / max(count - 1, np.float32(1.0))) + 1e-8)
    shifted = logits - row_max(logits)[:, None]
    probs = np.exp(shifted)
    log_probs = shifted - np.log(row_sums(probs))[:, None]
    np.exp(log_probs, out=probs)
    taken = taken_index(actions, logits.shape[1])
    log_ratio = log_probs.take(taken) - old_logprob
    ratio = np.exp(log_ratio)
    low, high = 1 - clip_coef, 1 + clip_coef
    neg_adv = -advantages
    unclipped, clipped = neg_adv * ratio, neg_adv * np.clip(ratio, low, high)
    value_error = value - returns
    if clip_vloss:
        value_step = value - old_value
        clipped_error = old_value + np.clip(value_step, -clip_coef, clip_coef) - returns
        squared, clipped_squared = np.square(value_error), np.square(clipped_error)
        value_terms = np.maximum(squared, clipped_squared)
    else:
        value_terms = np.square(value_error)
    ratio_step = ratio - 1.0
    terms = np.stack([np.maximum(unclipped, clipped), value_terms, -row_sums(probs * log_probs),
                      ratio_step - log_ratio, (np.abs(ratio_step) > clip_coef).astype(np.float32)])
    pg_loss, value_sum, entropy, approx_kl, clip_fraction = terms @ weight
    v_loss = 0.5 * value_sum
    loss = pg_loss - ent_coef * entropy + vf_coef * v_loss

    share = np.where((ratio >= low) & (ratio <= high), np.float32(1.0), _max_share_numpy(unclipped, clipped))
    grad_logprob = weight * neg_adv * share * ratio
    grad_log_probs = (log_probs + 1.0) * probs * (weight * ent_coef)[:, None]
    grad_log_probs.reshape(-1)[taken] += grad_logprob  # one index per row: no repeats
    grad_logits = grad_log_probs - probs * row_sums(grad_log_probs)[:, None]
    if clip_vloss:
        share_v = _max_share_numpy(squared, clipped_squared)
        passes = (value_step >= -clip_coef) & (value_step <= clip_coef)
        slope = share_v * value_error + (1.0 - share_v) * clipped_error * passes
    else:
        slope = value_error
    grad_value = slope * (weight * vf_coef)
    scalars = np.array([loss, pg_loss, v_loss, entropy, approx_kl, clip_fraction], dtype=np.float32)
    return scalars, grad_logits, grad_value
