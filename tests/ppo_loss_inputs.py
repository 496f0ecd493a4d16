"""Random inputs of a PPO minibatch loss, shared by the tests that compare one loss-gradient path
with another (autograd, the torch hand-written step, the NumPy one)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

LOSS_INPUTS = {"rows": st.integers(1, 40), "actions": st.integers(2, 6), "seed": st.integers(0, 2**16),
               "near_old": st.booleans(), "masked": st.floats(0.0, 0.6)}
"""Hypothesis strategies for ``loss_inputs``'s arguments."""


def loss_inputs(rows: int, actions: int, seed: int, near_old: bool, masked: float
                ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """(logits, values, the rest of the batch: actions as float32, old log-probabilities, advantages,
    returns, old values, mask). ``near_old``: the policy and values the batch was collected with
    (ties in both ``max`` calls); else ratios away from 1, so both clipping branches are exercised.
    ``masked``: the share of rows masked out."""
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    logits, values = randn(rows, actions), randn(rows)
    taken = torch.randint(actions, (rows,), generator=gen)
    old_logprob = torch.log_softmax(logits, -1).gather(-1, taken[:, None]).squeeze(-1)
    if not near_old:
        old_logprob = old_logprob + 0.5 * randn(rows)
    old_value = values if near_old else values + 0.5 * randn(rows)
    mask = (torch.rand(rows, generator=gen) >= masked).float()
    return logits, values, (taken.float(), old_logprob, randn(rows), randn(rows), old_value, mask)
