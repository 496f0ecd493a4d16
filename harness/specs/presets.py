"""Shipped presets (``presets/*.yaml``) and user config files -> ``VariantSpec``s.

A preset file holds ``description``, ``config`` (every algorithmic setting, shared) and
``variants`` (``baseline`` / ``optimized``: implementation flags only, as they differ from the flag
registry: ``baseline`` from its plain values, ``optimized`` from its optimised ones), and optionally
``on_device`` (keys a variant adds where the run's device is of a kind, e.g. ``cuda_graphs: true`` on
CUDA, an explicit value the CPU would refuse). A plain config file (no ``variants``) is one run of its own.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from reference_trainers.config.schema import TrainConfig, build_config
from reference_trainers.config.files import deep_merge, read_yaml
from reference_trainers.config.errors import ConfigError
from reference_trainers.config.flags import optimised_variant

from harness.errors import UserError

if TYPE_CHECKING:
    from harness.specs.own_trainer import OwnConfig

PRESET_DIR = Path(__file__).resolve().parent / "presets"
VARIANTS = ("baseline", "optimized")
DEVICE_KINDS = ("cpu", "cuda", "mps")
"""The device kinds an ``on_device`` section may name."""


@dataclass
class VariantSpec:
    """One thing to measure: a preset's variant (or a config file) and its config."""

    preset: str
    variant: str
    config: TrainConfig | OwnConfig
    build: Callable[..., object] | None = None
    """Trainer factory ``build(resolution, probe=...)``; None = the reference trainer of ``config.algo``."""


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    shared: dict[str, Any]
    variants: dict[str, dict[str, Any]]
    trainer: str | None = None
    """``MODULE:ATTRIBUTE`` of a user's trainer factory (``own_trainer``); None: rlgauge's trainers."""
    own: dict[str, Any] = field(default_factory=dict)
    """A user's trainer file's rlgauge sections: ``run``, ``device``, ``seed``."""
    folder: Path | None = None
    """The file's folder (a user's trainer module may sit beside it)."""
    on_device: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """Device kind -> variant -> keys merged over the variant where the run's device is of that kind."""
    trainer_origin: str = "--trainer"
    """Where ``trainer`` was given, as messages blame it: ``--trainer`` or ``FILE: trainer:``."""

    @property
    def single(self) -> bool:
        """A file without ``variants:``: one run, named ``config``."""
        return list(self.variants) == ["config"]

    def variant_data(self, variant: str) -> dict[str, Any]:
        """The variant's config: ``optimized`` starts from the registry's optimised values, every other
        variant from the plain ones; the variant's own keys win over both. A user's trainer: the
        shared ``config`` with the variant's keys merged over it."""
        if variant not in self.variants:
            raise UserError(f"--variant {variant!r}: {self.name} has {', '.join(self.variants)}")
        if self.trainer is not None:
            return deep_merge(self.shared, self.variants[variant])
        base = deep_merge(self.shared, optimised_variant()) if variant == "optimized" else self.shared
        return deep_merge(base, self.variants[variant])


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


OWN_TRAINER_KEYS = ("trainer", "description", "config", "variants", "run", "device", "seed")
"""Top-level keys of a user's trainer file (``trainer:`` names the factory)."""


def _parse_own(name: str, data: dict[str, Any], source: Path, trainer: Any, origin: str | None = None) -> Preset:
    """A user's trainer file: ``trainer``, ``description``, ``config`` (free-form, shared),
    ``variants`` (each merged over ``config``), and rlgauge's ``run``, ``device``, ``seed``.
    ``origin``: where ``trainer`` was given (default: the file's ``trainer:`` key)."""
    from harness.specs.own_trainer import check_trainer_text

    unknown = sorted(set(data) - set(OWN_TRAINER_KEYS))
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key {unknown[0]!r}; accepted beside trainer: "
                          f"{', '.join(OWN_TRAINER_KEYS[1:])} (your trainer's own keys go under config:)")
    origin = origin or f"{source}: trainer:"
    check_trainer_text(trainer, origin)
    shared = data.get("config") or {}
    variants = data.get("variants") or {"config": {}}
    if not isinstance(shared, dict):
        raise ConfigError(f"{source}: config must be a mapping of your trainer's settings")
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise ConfigError(f"{source}: variants must map variant names (e.g. {', '.join(VARIANTS)}) to mappings of "
                          "your trainer's settings")
    own = {key: data[key] for key in ("run", "device", "seed") if key in data}
    return Preset(name, str(data.get("description", "")), shared, variants, trainer, own, source.parent.resolve(),
                  trainer_origin=origin)


def _parse(name: str, data: dict[str, Any], source: Path) -> Preset:
    if "trainer" in data:
        return _parse_own(name, data, source, data["trainer"])
    if "variants" not in data:
        return Preset(name, str(data.get("description", "")), {k: v for k, v in data.items() if k != "description"},
                      {"config": {}})
    unknown = sorted(set(data) - {"description", "config", "variants", "on_device"})
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key {unknown[0]!r}; accepted in a preset: description, config, "
                          "variants, on_device")
    if "config" not in data:  # else every variant would silently run the default PPO on CartPole
        raise ConfigError(f"{source}: a preset (a file with variants) needs config:, the settings its variants share "
                          f"(e.g. algo, env); it has only {', '.join(sorted(data))}")
    variants = data["variants"]
    if not isinstance(variants, dict) or not variants or not all(isinstance(v, dict) for v in variants.values()):
        raise ConfigError(f"{source}: variants must map variant names ({', '.join(VARIANTS)}) to config mappings")
    shared = data.get("config") or {}
    if not isinstance(shared, dict):
        raise ConfigError(f"{source}: config must be a mapping")
    return Preset(name, str(data.get("description", "")), shared, variants,
                  on_device=_parse_on_device(data.get("on_device"), variants, source))


def _parse_on_device(section: Any, variants: dict[str, Any], source: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """``on_device: {KIND: {VARIANT: {...config keys...}}}``, every kind and variant checked."""
    if section is None:
        return {}
    accepted = f"accepted: a mapping of device kinds ({', '.join(DEVICE_KINDS)}) to variants ({', '.join(variants)})"
    if not isinstance(section, dict):
        raise ConfigError(f"{source}: on_device must be a mapping; {accepted}")
    for kind, by_variant in section.items():
        if kind not in DEVICE_KINDS:
            raise ConfigError(f"{source}: on_device: unknown device kind {kind!r}; {accepted}")
        if not isinstance(by_variant, dict) or not all(isinstance(v, dict) for v in by_variant.values()):
            raise ConfigError(f"{source}: on_device.{kind} must map variants to config mappings; {accepted}")
        unknown = sorted(set(by_variant) - set(variants))
        if unknown:
            raise ConfigError(f"{source}: on_device.{kind}: the preset has no variant {unknown[0]!r}; {accepted}")
    return section


def device_kind(requested: str) -> str:
    """The kind of device a config's ``device`` names (``auto``: the one it resolves to here)."""
    if requested == "auto":
        from reference_trainers.runtime.device import available_devices

        return available_devices()[0]
    return requested.partition(":")[0]


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


def listing_lines(presets: list[Preset], width: int | None = None) -> list[str]:
    """``rlgauge presets``: names in a column as wide as the longest, then description and variants.

    One line per preset; with a ``width`` (a terminal's), a long description wraps under its own column."""
    import textwrap

    column = max((len(preset.name) for preset in presets), default=0) + 2
    lines = []
    for preset in presets:
        text = f"{preset.description}  [variants: {', '.join(preset.variants)}]"
        if width is None:
            lines.append(f"{preset.name:<{column}}{text}")
            continue
        wrapped = textwrap.wrap(text, width=max(width - column, 30), break_on_hyphens=False) or [""]
        lines.append(f"{preset.name:<{column}}{wrapped[0]}")
        lines.extend(" " * column + rest for rest in wrapped[1:])
    return lines


SELECTIONS = ("both", "all")
"""``--variant`` words besides variant names: ``both`` (baseline and optimized), ``all`` (every variant)."""


def variant_names(preset: Preset, selection: str) -> list[str]:
    """The variants ``--variant`` selects, the reference first: ``both`` (baseline and optimized where
    the file defines both; else baseline, or every variant), ``all`` (every variant, baseline first),
    or one name or a comma list of them (the first named is the reference). A name the file does not
    define is a ``UserError`` listing those it does; a file without variants runs its one, ``config``."""
    defined = list(preset.variants)
    if preset.single:
        if selection in ("config", *SELECTIONS, *VARIANTS):  # baseline/optimized: sweep's and calibrate's default
            return ["config"]
        raise UserError(f"--variant {selection}: {preset.name} has no variants: section, so one run, named config; "
                        f"accepted: config, {', '.join(SELECTIONS)}")
    if selection == "both":
        return [v for v in VARIANTS if v in defined] or defined
    if selection == "all":
        return sorted(defined, key=lambda name: name != "baseline")
    names = [name.strip() for name in selection.split(",")]
    accepted = (f"defined: {', '.join(defined)}; or {' or '.join(SELECTIONS)}, or a comma list such as "
                f"{','.join(defined[:2])}")
    if not all(names):
        raise UserError(f"--variant {selection}: an empty name in the list; {accepted}")
    unknown = [name for name in names if name not in defined]
    if unknown:
        raise UserError(f"--variant {selection}: {preset.name} defines no variant {unknown[0]!r}; {accepted}")
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:
        raise UserError(f"--variant {selection}: {twice} is named twice; {accepted}")
    return names


def left_out(preset: Preset, names: list[str]) -> list[str]:
    """The variants a file defines that ``names`` leaves out (none for a file without variants)."""
    return [] if preset.single else [name for name in preset.variants if name not in names]


def specs_for(target: str, variant: str, overrides: list[str]) -> list[VariantSpec]:
    """Validated specs for ``--variant`` (``variant_names``; a plain config file: its one run)."""
    return specs_of(load_preset(target), variant, overrides)


def specs_of(preset: Preset, variant: str, overrides: list[str]) -> list[VariantSpec]:
    """``specs_for`` of a loaded preset (a shipped one, a file, or ``own_trainer_preset``'s)."""
    names = variant_names(preset, variant)
    if preset.trainer is not None:
        return _own_specs(preset, names, overrides)
    return [VariantSpec(preset.name, name, _build_variant(preset, name, overrides)) for name in names]


def _build_variant(preset: Preset, name: str, overrides: list[str]) -> TrainConfig:
    """The variant's config, with its ``on_device`` keys for the device the run will use (``--set`` wins)."""
    data = preset.variant_data(name)
    config = build_config(data, overrides)
    extra = preset.on_device.get(device_kind(config.device), {}).get(name) if preset.on_device else None
    return build_config(deep_merge(data, extra), overrides) if extra else config


def own_trainer_preset(trainer: str, config_file: Path | None) -> Preset:
    """``run --trainer MODULE:ATTRIBUTE [--config FILE]``: the file's preset with its ``trainer:``
    replaced (a file without one is read as the user's settings, with optional variants)."""
    if config_file is None:
        return Preset(trainer.partition(":")[0].rpartition(".")[2] or trainer, "", {}, {"config": {}}, trainer, {}, None)
    data = read_yaml(config_file)
    if not any(key in data for key in OWN_TRAINER_KEYS):  # a bare mapping of the user's settings
        data = {"config": data}
    return _parse_own(config_file.stem, {**data, "trainer": trainer}, config_file, trainer, "--trainer")


def _own_specs(preset: Preset, names: list[str], overrides: list[str]) -> list[VariantSpec]:
    from harness.specs.own_trainer import build_own_config, own_builder

    assert preset.trainer is not None
    build = own_builder(preset.trainer, [preset.folder] if preset.folder else None,  # imported now: fails fast
                        preset.trainer_origin)
    source = str(preset.folder / preset.name) if preset.folder else preset.name
    return [VariantSpec(preset.name, name, build_own_config(preset.trainer, {**preset.own, "config":
                                                                            preset.variant_data(name)},
                                                            overrides, source), build=build)
            for name in names]
