"""Phase probes: trainers report phase boundaries; the default probe does nothing."""

from __future__ import annotations

import contextlib
from typing import ContextManager, Protocol

PHASES: tuple[str, ...] = ("env", "inference", "update", "transfer", "logging")
"""env: stepping environments; inference: action selection (incl. the action host copy);
update: advantage computation and optimiser steps; transfer: host->device copies of
observations, rewards and flags; logging: statistics and episode bookkeeping."""


class Probe(Protocol):
    def phase(self, name: str) -> ContextManager[None]:
        """Context manager around one phase (a name from ``PHASES``)."""


class NullProbe:
    """The default probe: costs one attribute lookup per phase."""

    _null = contextlib.nullcontext()

    def phase(self, name: str) -> ContextManager[None]:
        return self._null
