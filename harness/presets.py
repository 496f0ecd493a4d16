"""Shipped presets (``presets/*.yaml``) and user config files -> ``VariantSpec``s.

A preset file holds ``description``, ``config`` (every algorithmic setting, shared) and
``variants`` (``baseline`` / ``optimized``: implementation flags only, as they differ from the flag
registry: ``baseline`` from its plain values, ``optimized`` from its optimised ones). A plain config file
(no ``variants``) is one run of its own.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from reference_trainers.common.config import TrainConfig, build_config
from reference_trainers.common.config_files import deep_merge, read_yaml
from reference_trainers.common.errors import ConfigError
from reference_trainers.common.flags import optimised_variant

from .errors import UserError

PRESET_DIR = Path(__file__).resolve().parent / "presets"
VARIANTS = ("baseline", "optimized")


@dataclass
class VariantSpec:
    """One thing to measure: a preset's variant (or a config file) and its config."""

    preset: str
    variant: str
    config: TrainConfig
    build: Callable[..., object] | None = None
    """Trainer factory ``build(resolution, probe=...)``; None = the reference trainer of ``config.algo``."""


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    shared: dict[str, Any]
    variants: dict[str, dict[str, Any]]

    def variant_data(self, variant: str) -> dict[str, Any]:
        """The variant's config: ``optimized`` starts from the registry's optimised values, every other
        variant from the plain ones; the variant's own keys win over both."""
        if variant not in self.variants:
            raise UserError(f"--variant {variant!r}: {self.name} has {', '.join(self.variants)}")
        base = deep_merge(self.shared, optimised_variant()) if variant == "optimized" else self.shared
        return deep_merge(base, self.variants[variant])


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _parse(name: str, data: dict[str, Any], source: Path) -> Preset:
    if "variants" not in data:
        return Preset(name, str(data.get("description", "")), {k: v for k, v in data.items() if k != "description"},
                      {"config": {}})
    unknown = sorted(set(data) - {"description", "config", "variants"})
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key {unknown[0]!r}; accepted in a preset: description, config, variants")
    variants = data["variants"]
    if not isinstance(variants, dict) or not variants or not all(isinstance(v, dict) for v in variants.values()):
        raise ConfigError(f"{source}: variants must map variant names ({', '.join(VARIANTS)}) to config mappings")
    shared = data.get("config") or {}
    if not isinstance(shared, dict):
        raise ConfigError(f"{source}: config must be a mapping")
    return Preset(name, str(data.get("description", "")), shared, variants)


def load_preset(target: str) -> Preset:
    """A shipped preset by name, or a YAML file by path."""
    path = Path(target)
    if target.endswith((".yaml", ".yml")) or path.exists():
        return _parse(path.stem, read_yaml(path), path)
    names = preset_names()
    if target not in names:
        guess = difflib.get_close_matches(target, names, n=1)
        hint = f"; did you mean '{guess[0]}'?" if guess else ""
        raise UserError(f"unknown preset {target!r}{hint} (available: {', '.join(names)}; or give a FILE.yaml)")
    source = PRESET_DIR / f"{target}.yaml"
    return _parse(target, read_yaml(source), source)


def list_presets() -> list[Preset]:
    return [load_preset(name) for name in preset_names()]


def specs_for(target: str, variant: str, overrides: list[str]) -> list[VariantSpec]:
    """Validated specs for ``--variant baseline|optimized|both`` (a plain config file: its one run)."""
    preset = load_preset(target)
    if "config" in preset.variants and len(preset.variants) == 1:
        names = ["config"]
    elif variant == "both":
        names = [v for v in VARIANTS if v in preset.variants] or list(preset.variants)
    else:
        names = [variant]
    return [VariantSpec(preset.name, name, build_config(preset.variant_data(name), overrides)) for name in names]
