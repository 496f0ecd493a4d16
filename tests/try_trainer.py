"""A tiny policy-gradient trainer for ``rlgauge try``'s tests: no env library, a few rows per call.

``fail_without_checks``: ``iterate()`` raises when torch.distributions' argument checks are off by default
(``no_validate_args``), so one trial fails while the others run.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class Tiny:
    def __init__(self, config: dict, seed: int) -> None:
        torch.manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        self.rows = config.get("rows", 16)
        self.fail_without_checks = bool(config.get("fail_without_checks"))
        self.policy = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=1e-2)

    def iterate(self) -> int:
        if self.fail_without_checks and not torch.distributions.Distribution._validate_args:
            raise RuntimeError("planted failure: distribution checks are off")
        obs = torch.tensor(self.rng.standard_normal((self.rows, 4)), dtype=torch.float32)
        dist = torch.distributions.Categorical(logits=self.policy(obs))
        actions = dist.sample()
        reward = (actions == (obs[:, 0] > 0).long()).float()
        loss = -(dist.log_prob(actions) * (reward - reward.mean())).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return self.rows

    def close(self) -> None:
        pass


def make_trainer(config: dict, *, device: str, seed: int) -> Tiny:
    return Tiny(config, seed)
