"""rlgauge's public API for your own code (the ``rlgauge`` command lives in ``harness.cli``).

- ``measure(name, out=...)``: measure a training loop in place (``harness.integrations.measured_loop``);
- ``Trainer`` / ``TrainerFactory``: the contract a trainer given to ``rlgauge run --trainer``
  fulfils (``harness.specs.own_trainer``);
- ``gate(...) -> GateVerdict``: ``rlgauge gate`` in this process, its ``Outcome`` typed (pass, fail, no verdict,
  bad input, interrupted) (``harness.integrations.gate_api``).

For pytest, the ``rlgauge`` fixture (``harness.integrations.pytest_plugin``, registered on install); for asv,
``harness.integrations.asv_helpers.trainer_benchmarks``.

Names load on first use, so ``import harness`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.integrations.measured_loop import Measurement, measure
    from harness.specs.own_trainer import OwnTrainerProtocol as Trainer
    from harness.specs.own_trainer import TrainerFactory
    from harness.analyses.gate_outcome import GateVerdict, Outcome
    from harness.integrations.gate_api import gate

_LAZY = {"measure": ("integrations.measured_loop", "measure"),
         "Measurement": ("integrations.measured_loop", "Measurement"),
         "Trainer": ("specs.own_trainer", "OwnTrainerProtocol"),
         "TrainerFactory": ("specs.own_trainer", "TrainerFactory"),
         "gate": ("integrations.gate_api", "gate"),
         "GateVerdict": ("analyses.gate_outcome", "GateVerdict"),
         "Outcome": ("analyses.gate_outcome", "Outcome")}

__all__ = ["GateVerdict", "Measurement", "Outcome", "Trainer", "TrainerFactory", "gate", "measure"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    return getattr(importlib.import_module(f".{module}", __name__), attribute)
