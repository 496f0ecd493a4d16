"""A tiny trainer for ``rlgauge try``'s ``autocast_bf16``: it acts under ``no_grad`` with a ``.numpy()`` of the
policy's output, and its update builds a projection from the update forward's output with ``index_add_`` of a
float32 tensor (C51's shape). Both raise when a whole ``iterate()`` runs under bfloat16 autocast."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class Tiny:
    def __init__(self, config: dict, seed: int) -> None:
        torch.manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        self.rows = config.get("rows", 16)
        self.policy = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=1e-2)

    def iterate(self) -> int:
        obs = torch.tensor(self.rng.standard_normal((self.rows, 4)), dtype=torch.float32)
        with torch.no_grad():
            probs = torch.softmax(self.policy(obs), dim=1).numpy()  # acting: a host copy of the output
        actions = torch.as_tensor((probs[:, 1] > self.rng.random(self.rows)).astype(np.int64))
        out = self.policy(obs)
        weights = torch.ones(self.rows, dtype=torch.float32)
        target = torch.zeros_like(out[:, 0]).index_add_(0, actions, weights) / self.rows  # self: the forward's dtype
        loss = ((out.gather(1, actions[:, None]).squeeze(1) - target[actions]) ** 2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return self.rows

    def close(self) -> None:
        pass


def make_trainer(config: dict, *, device: str, seed: int) -> Tiny:
    return Tiny(config, seed)
