"""Peer libraries measured beside the reference trainers (``rlgauge run PRESET --peer NAME``).

A peer adapter builds another library's trainer from the same config (hyper-parameters
matched through an explicit table) and exposes the runner's trainer protocol, so it is
measured by the same runner, interleaved with our variants, with the same metrics.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from harness.errors import UserError

PEERS = {"sb3": ("harness.specs.peers.sb3", "stable_baselines3", "stable-baselines3")}
"""Peer name -> (adapter module, library import name, distribution name)."""


def load_peer(name: str) -> ModuleType:
    """The adapter module of peer ``name``; ``UserError`` when unknown or its library is not installed."""
    if name not in PEERS:
        raise UserError(f"--peer {name!r}: unknown peer; accepted: {', '.join(PEERS)}")
    module, library, distribution = PEERS[name]
    try:
        importlib.import_module(library)
    except ImportError:
        raise UserError(f"--peer {name}: needs {distribution}; install it with pip install 'rlgauge[peers]'") from None
    return importlib.import_module(module)
