"""Training statistics (losses, KL, clip fraction): per-value syncs, or sync-free accumulators."""

from __future__ import annotations

from collections import defaultdict

import torch


class ItemStats:
    """Plain path: every logged value leaves the device at once via ``.detach().float().item()``."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = defaultdict(float)
        self._counts: dict[str, int] = defaultdict(int)

    def add(self, name: str, value: torch.Tensor) -> None:
        self._sums[name] += value.detach().float().item()
        self._counts[name] += 1

    def flush(self) -> dict[str, float]:
        """Means since the last flush."""
        means = {k: self._sums[k] / self._counts[k] for k in self._sums}
        self._sums.clear()
        self._counts.clear()
        return means


class SyncFreeStats:
    """Optimised path: float32 accumulators on the device; one host sync per ``flush``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int] = defaultdict(int)

    def add(self, name: str, value: torch.Tensor) -> None:
        total = self._sums.get(name)
        if total is None:
            total = self._sums[name] = torch.zeros((), dtype=torch.float32, device=self.device)
        total.add_(value.detach().float())
        self._counts[name] += 1

    def flush(self) -> dict[str, float]:
        names = [n for n in self._sums if self._counts[n]]
        if not names:
            return {}
        values = torch.stack([self._sums[n] for n in names]).cpu().tolist()  # the one sync
        means = {n: v / self._counts[n] for n, v in zip(names, values)}
        for total in self._sums.values():
            total.zero_()
        self._counts.clear()
        return means


def make_stats(sync_free: bool, device: torch.device) -> ItemStats | SyncFreeStats:
    return SyncFreeStats(device) if sync_free else ItemStats()
