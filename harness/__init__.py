"""rlgauge's public API for your own code (the ``rlgauge`` command lives in ``harness.cli``).

- ``measure(name, out=...)``: measure a training loop in place (``harness.measured_loop``);
- ``Trainer`` / ``TrainerFactory``: the contract a trainer given to ``rlgauge run --trainer``
  fulfils (``harness.own_trainer``).

For pytest, the ``rlgauge`` fixture (``harness.pytest_plugin``, registered on install); for asv,
``harness.asv_helpers.trainer_benchmarks``.

Names load on first use, so ``import harness`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .measured_loop import Measurement, measure
    from .own_trainer import OwnTrainerProtocol as Trainer
    from .own_trainer import TrainerFactory

_LAZY = {"measure": ("measured_loop", "measure"), "Measurement": ("measured_loop", "Measurement"),
         "Trainer": ("own_trainer", "OwnTrainerProtocol"), "TrainerFactory": ("own_trainer", "TrainerFactory")}

__all__ = ["Measurement", "Trainer", "TrainerFactory", "measure"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    return getattr(importlib.import_module(f".{module}", __name__), attribute)
