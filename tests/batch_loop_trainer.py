"""A distributional-DQN-shaped update with a Python loop over the batch's rows (CleanRL c51's projection); with
``minibatches``, a PPO-shaped update instead: a loop over minibatches whose body takes an optimizer step."""

from __future__ import annotations

from typing import Iterator

import torch


def make_trainer(config: dict | None = None, *, device: str = "cpu", seed: int = 0) -> Iterator[int]:
    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 8)
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    batch = torch.randn(32, 4)
    while (config or {}).get("minibatches"):
        for start in range(0, len(batch), 8):  # a minibatch loop: one optimizer step an iteration
            loss = net(batch[start:start + 8]).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        yield 4
    while True:
        with torch.no_grad():
            target = net(batch)
            projected = torch.zeros(32, 8)
            index = torch.arange(8)
            for row in range(32):  # the loop over the batch
                projected[row].index_add_(0, index, target[row])  # one small kernel per row
        loss = ((net(batch) - projected) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        yield 4
