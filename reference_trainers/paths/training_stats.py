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

    def add_all(self, values: dict[str, torch.Tensor]) -> None:
        """``add`` each of several values (one sync each)."""
        for name, value in values.items():
            self.add(name, value)

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
        self._groups: dict[tuple[str, ...], torch.Tensor] = {}  # add_all's accumulators, one per set of names
        self._counts: dict[str, int] = defaultdict(int)

    def add(self, name: str, value: torch.Tensor) -> None:
        total = self._sums.get(name)
        if total is None:
            total = self._sums[name] = torch.zeros((), dtype=torch.float32, device=self.device)
        total.add_(value.detach().float())
        self._counts[name] += 1

    def add_all(self, values: dict[str, torch.Tensor]) -> None:
        """Several 0-d values at once (a step's statistics): one stack and one in-place add."""
        names = tuple(values)
        if not names:
            return
        with torch.no_grad():
            stacked = torch.stack(list(values.values()))
        total = self._groups.get(names)
        if total is None:
            total = self._groups[names] = torch.zeros(len(names), dtype=torch.float32, device=self.device)
        total.add_(stacked)
        for name in names:
            self._counts[name] += 1

    def flush(self) -> dict[str, float]:
        names = [n for n in self._counts if self._counts[n]]
        if not names:
            return {}
        labels = list(self._sums) + [n for group in self._groups for n in group]
        vectors = ([torch.stack(list(self._sums.values()))] if self._sums else []) + list(self._groups.values())
        totals: dict[str, float] = defaultdict(float)
        for label, value in zip(labels, torch.cat(vectors).cpu().tolist()):  # the one sync
            totals[label] += value
        means = {n: totals[n] / self._counts[n] for n in names}
        for total in [*self._sums.values(), *self._groups.values()]:
            total.zero_()
        self._counts.clear()
        return means


def make_stats(sync_free: bool, device: torch.device) -> ItemStats | SyncFreeStats:
    return SyncFreeStats(device) if sync_free else ItemStats()
