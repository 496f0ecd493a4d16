"""How a flag resolves on the TINY PPO config: refused where it cannot run, ``auto`` where it applies."""

from __future__ import annotations

import pytest
from conftest import TINY

from reference_trainers.config.schema import ConfigError, build_config
from reference_trainers.config.resolve import resolve_config


def assert_refused(name: str, overrides: list[str], message: str) -> None:
    """``optimizations.NAME: true`` with ``overrides`` is a one-line ConfigError naming the flag and ``message``."""
    config = build_config({}, TINY + overrides + [f"optimizations.{name}=true"])
    with pytest.raises(ConfigError, match=f"^optimizations.{name}: true ") as info:
        resolve_config(config)
    assert message in str(info.value)


def assert_auto_resolves(name: str, overrides: list[str], expected: bool) -> None:
    """``optimizations.NAME: auto`` with ``overrides`` resolves to ``expected`` and records its reason."""
    resolution = resolve_config(build_config({}, TINY + overrides + [f"optimizations.{name}=auto"]))
    assert getattr(resolution.config.optimizations, name) is expected
    assert f"optimizations.{name}" in resolution.reasons
