"""Proportional prioritized experience replay (Schaul et al. 2016), tensorised on the device.

Priorities ``p_i = (|delta_i| + eps) ** alpha`` live in a sum tree and a min tree: flat
tensors of ``2 * L`` nodes (``L`` = capacity rounded up to a power of two; node 1 is the
root, node k has children 2k and 2k + 1, leaves are ``L + i``). A batch of priority
updates rewrites its leaves and then every ancestor level in one vector op per level; a
minibatch descends all samples together (stratified: one uniform draw per equal slice of
the total mass). Both cost O(log capacity) tensor ops per batch, no Python loop over
samples or capacity, and no host sync.
"""

from __future__ import annotations

import torch


class PrioritizedSampler:
    """Indices with probability ``P(i) = p_i / sum_k p_k`` and importance weights
    ``w_i = (size * P(i)) ** -beta / max_k w_k``. New transitions get the largest priority
    seen so far, so each is replayed at least once with high probability.
    Guarded by the frequency and weight tests in tests/test_buffers.py."""

    def __init__(self, capacity: int, alpha: float, eps: float, device: torch.device,
                 generator: torch.Generator) -> None:
        self.capacity, self.alpha, self.eps = capacity, alpha, eps
        self.device, self.generator = device, generator
        self.depth = max(1, (capacity - 1).bit_length())
        self.leaves = 1 << self.depth
        self.sums = torch.zeros(2 * self.leaves, dtype=torch.float32, device=device)
        self.mins = torch.full((2 * self.leaves,), float("inf"), dtype=torch.float32, device=device)
        self.max_priority = torch.ones((), dtype=torch.float32, device=device)

    def _set(self, indices: torch.Tensor, priorities: torch.Tensor) -> None:
        """Write leaf priorities, then recompute their ancestors level by level (repeats are harmless)."""
        nodes = indices + self.leaves
        self.sums[nodes] = priorities
        self.mins[nodes] = priorities
        for _ in range(self.depth):
            nodes = nodes // 2
            left, right = 2 * nodes, 2 * nodes + 1
            self.sums[nodes] = self.sums[left] + self.sums[right]
            self.mins[nodes] = torch.minimum(self.mins[left], self.mins[right])

    def added(self, start: int, count: int) -> None:
        """Transitions written at ring positions ``start .. start + count - 1`` get the max priority."""
        indices = (start + torch.arange(count, device=self.device)) % self.capacity
        self._set(indices, self.max_priority.expand(count))

    def update(self, indices: torch.Tensor, errors: torch.Tensor) -> None:
        """New priorities from the absolute TD errors (or per-sample losses) of a minibatch.

        A non-finite error (a diverged update, e.g. under ``nan_policy: skip_update``) gets
        the largest priority seen instead, so that one bad batch cannot poison the tree.
        """
        priorities = (errors.detach().float().abs() + self.eps) ** self.alpha
        priorities = torch.where(torch.isfinite(priorities), priorities, self.max_priority)
        self._set(indices, priorities)
        torch.maximum(self.max_priority, priorities.max(), out=self.max_priority)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The sum and min trees and the largest priority (the generator is saved by its owner)."""
        return {"sums": self.sums.cpu().clone(), "mins": self.mins.cpu().clone(),
                "max_priority": self.max_priority.cpu().clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.sums.copy_(state["sums"])
        self.mins.copy_(state["mins"])
        self.max_priority.copy_(state["max_priority"])

    def probabilities(self, indices: torch.Tensor) -> torch.Tensor:
        """P(i) of the given ring positions."""
        return self.sums[indices + self.leaves] / self.sums[1]

    def sample(self, size: int, batch_size: int, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Stratified proportional sampling; returns (indices, importance weights)."""
        total = self.sums[1]
        strata = torch.arange(batch_size, dtype=torch.float32, device=self.device)
        mass = (strata + torch.rand(batch_size, generator=self.generator, device=self.device)) * (total / batch_size)
        nodes = torch.ones(batch_size, dtype=torch.int64, device=self.device)
        for _ in range(self.depth):
            left = 2 * nodes
            left_mass = self.sums[left]
            go_right = mass > left_mass
            mass = torch.where(go_right, mass - left_mass, mass)
            nodes = left + go_right.long()
        indices = (nodes - self.leaves).clamp_(0, size - 1)  # float round-off can overshoot into empty leaves
        probs = self.probabilities(indices)
        min_prob = self.mins[1] / total
        weights = (probs / min_prob) ** -beta  # = (size * P(i)) ** -beta / (size * min P) ** -beta
        return indices, weights
