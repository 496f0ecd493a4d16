"""A tiny value-learning trainer for the tests of ``rlgauge try``'s parity: a Q-network, a target network made by
``copy.deepcopy``, an observation normaliser that holds only buffers, and Adam.

``break_without_checks``: what breaks when torch.distributions' argument checks are off by default
(``no_validate_args``): ``"nan"`` turns the Q-network's weights into NaN, ``"normaliser"`` moves only the
normaliser's buffers, ``"target"`` only the target network's weights, ``"optimizer"`` only Adam's state.
``hang_in_changed_arm``: ``iterate()`` sleeps for ever once checks are off (a hung arm).
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch
from torch import nn


class Normaliser(nn.Module):
    """A running mean and count: buffers, no parameters."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(size))
        self.register_buffer("count", torch.zeros(()))

    def update(self, obs: torch.Tensor) -> None:
        self.count += obs.shape[0]
        self.mean += (obs.mean(0) - self.mean) * obs.shape[0] / self.count


class Tiny:
    def __init__(self, config: dict, seed: int) -> None:
        torch.manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        self.rows = 16
        self.breaks = config.get("break_without_checks")
        self.hangs = bool(config.get("hang_in_changed_arm"))
        self.q = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
        self.target = copy.deepcopy(self.q)
        self.norm = Normaliser(4)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=1e-2)

    def iterate(self) -> int:
        changed = not torch.distributions.Distribution._validate_args
        while changed and self.hangs:
            time.sleep(1.0)
        obs = torch.tensor(self.rng.standard_normal((self.rows, 4)), dtype=torch.float32)
        self.norm.update(obs)
        loss = ((self.q(obs - self.norm.mean) - self.target(obs).detach()) ** 2).mean() + 0.1
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        with torch.no_grad():
            self.target[0].weight.mul_(0.9).add_(0.1 * self.q[0].weight)
            if changed and self.breaks == "nan":
                self.q[0].weight.fill_(float("nan"))
            elif changed and self.breaks == "normaliser":
                self.norm.mean.add_(1.0)
            elif changed and self.breaks == "target":
                self.target[2].bias.add_(1.0)
            elif changed and self.breaks == "optimizer":
                for state in self.optimizer.state.values():
                    state["exp_avg_sq"].mul_(2.0)
        return self.rows

    def close(self) -> None:
        pass


def make_trainer(config: dict, *, device: str, seed: int) -> Tiny:
    return Tiny(config, seed)
