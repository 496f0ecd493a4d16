"""The flag registry is the one table of flags: the schema, presets, docs and effect tests agree with it."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Literal, get_origin

import pytest

from harness.report import flag_docs
from harness.stats.parity import FLAG_CLASSES, flag_class
from harness.specs.presets import list_presets, load_preset
from reference_trainers.config.schema import ConfigError, OptimizationsConfig, TrainConfig, build_config
from reference_trainers.config.flags import (ALGOS, FLAGS, OPTIMISATION, OPTIMISATION_FLAGS, PARITY_CLASSES, REGISTRY, resolve_reference,
                                             Flag)
from reference_trainers.config.resolve import resolve_config

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _effect_markers() -> set[tuple[str, Any]]:
    """Every ``pytest.mark.flag_effect(KEY[, VALUE])`` written in the test sources, read statically."""
    found: set[tuple[str, Any]] = set()
    for path in TESTS.rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "flag_effect" and node.args):
                args = [ast.literal_eval(a) for a in node.args]
                found.add((args[0], args[1] if len(args) > 1 else None))
    return found


def _needs_one_per_value(entry: Flag) -> bool:
    """An optimisation whose optimised values are distinct paths (a Literal: vectorization modes, Adam kernels)."""
    return entry.role == OPTIMISATION and get_origin(entry.annotation) is Literal


def _required_effects() -> list[tuple[str, Any]]:
    required: list[tuple[str, Any]] = []
    for entry in FLAGS:
        if _needs_one_per_value(entry):
            required += [(entry.key, value) for value in entry.optimised]
        else:
            required.append((entry.key, None))
    return required


@pytest.mark.parametrize("key, value", _required_effects(), ids=lambda x: str(x))
def test_every_registry_flag_has_an_effect_test(key: str, value: Any) -> None:
    """A flag is done when a test proves its optimised path is taken (marked ``flag_effect``)."""
    markers = _effect_markers()
    assert (key, value) in markers or (value is not None and (key, str(value)) in markers), (
        f"no test marked pytest.mark.flag_effect({key!r}{'' if value is None else f', {value!r}'}) proves that "
        f"{key}{'' if value is None else f'={value}'} takes its optimised path")


def test_effect_markers_name_registry_flags() -> None:
    """A marker for a key or value the registry does not have is a typo, not a proof."""
    for key, value in _effect_markers():
        assert key in REGISTRY, f"flag_effect({key!r}) names no registry flag"
        if value is not None:
            assert value in REGISTRY[key].optimised or str(value) in map(str, REGISTRY[key].optimised), (key, value)


@pytest.mark.parametrize("entry", FLAGS, ids=lambda f: f.key)
def test_every_where_reference_of_the_registry_imports(entry: Flag) -> None:
    """docs/flags.md publishes these: each must name code that exists."""
    assert entry.where
    for reference in entry.where:
        assert reference.startswith("reference_trainers."), reference
        assert resolve_reference(reference) is not None, reference


def test_a_where_reference_to_missing_code_fails_to_resolve() -> None:
    with pytest.raises(AttributeError):
        resolve_reference("reference_trainers.paths.speedups:GraphedStep")
    with pytest.raises(ImportError):
        resolve_reference("reference_trainers.device:thread_settings")


@pytest.mark.parametrize("entry", FLAGS, ids=lambda f: f.key)
def test_registry_entry_is_complete_and_agrees_with_the_schema(entry: Flag) -> None:
    assert entry.parity in PARITY_CLASSES and entry.parity_why and entry.plain_path and entry.optimised_path
    assert entry.where and entry.phase in ("env", "inference", "update", "transfer", "logging")
    assert set(entry.algos) <= set(ALGOS)
    assert not any(entry.is_plain(v) for v in entry.optimised), "an optimised value equal to the plain one"
    section = TrainConfig.model_fields[entry.section].default_factory()
    assert getattr(section, entry.name) == entry.plain, f"schema default of {entry.key} is not the plain value"
    accepts_auto = "'auto'" in str(type(section).model_fields[entry.name].annotation)
    if entry.key != "env.vectorization":  # its auto needs the env's own entry points: envs.resolve_vectorization
        assert (entry.auto is not None) == accepts_auto, f"{entry.key}: an auto rule exactly where 'auto' is accepted"
    for value in entry.optimised:
        build_config({}, [f"{entry.key}={flag_docs._value(value)}"])  # every optimised value validates
    assert flag_class(entry.key, entry.optimised[0]) in PARITY_CLASSES


def test_the_optimisations_schema_is_the_registry() -> None:
    assert list(OptimizationsConfig.model_fields) == [f.name for f in OPTIMISATION_FLAGS]
    assert set(FLAG_CLASSES) >= {f.key for f in FLAGS}


def test_docs_flag_reference_is_generated_from_the_registry() -> None:
    text = (ROOT / "docs" / "flags.md").read_text(encoding="utf-8")
    assert text == flag_docs.render(), "docs/flags.md is stale: run python -m harness.report.flag_docs > docs/flags.md"


@pytest.mark.parametrize("name", [p.name for p in list_presets()])
def test_presets_state_only_what_differs_from_the_registry(name: str) -> None:
    """A variant that repeats the registry's value for a flag says nothing: such lines go stale silently."""
    preset = load_preset(name)
    for variant, data in preset.variants.items():
        for section, values in data.items():
            for key, value in (values or {}).items():
                entry = REGISTRY.get(f"{section}.{key}")
                if entry is None:
                    continue
                same = entry.preset if variant == "optimized" else entry.plain
                assert value != same, f"{name} {variant}: {section}.{key}: {value!r} is the registry's value already"


def _misplaced() -> list[tuple[Flag, str]]:
    """(flag, algo) pairs where an optimisation does not apply to the algorithm."""
    return [(f, algo) for f in OPTIMISATION_FLAGS for algo in ALGOS if algo not in f.algos]


@pytest.mark.parametrize("entry, algo", _misplaced(), ids=lambda x: x.key if isinstance(x, Flag) else x)
def test_an_optimised_value_where_the_flag_does_not_apply_is_one_clear_error(entry: Flag, algo: str) -> None:
    value = flag_docs._value(entry.optimised[0])
    with pytest.raises(ConfigError) as err:
        resolve_config(build_config({"algo": algo}, ["device=cpu", f"{entry.key}={value}"]))
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{entry.key}: ") and "accepted" in message
    assert f"algo {algo!r}" in message


@pytest.mark.parametrize("entry, algo", _misplaced(), ids=lambda x: x.key if isinstance(x, Flag) else x)
def test_auto_where_the_flag_does_not_apply_resolves_to_the_plain_value_with_a_reason(entry: Flag, algo: str) -> None:
    if entry.auto is None:
        pytest.skip("no auto value")
    resolution = resolve_config(build_config({"algo": algo}, ["device=cpu", f"{entry.key}=auto"]))
    section = getattr(resolution.config, entry.section)
    assert getattr(section, entry.name) == entry.plain
    assert algo in resolution.reasons[entry.key]


def test_flag_rules_live_only_in_the_registry() -> None:
    """resolve.py and the trainers raise no error about an optimisation flag of their own: every such rule is a
    registry blocker, so `rlgauge config`, `auto` and the docs read the same rules."""
    import re

    root = Path(__file__).resolve().parents[1] / "reference_trainers"
    rule = re.compile(r"ConfigError\(\s*f?[\"']optimizations\.")
    offenders = [f"{path.relative_to(root)}:{n}" for path in sorted(root.rglob("*.py")) if path.name != "flags.py"
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if rule.search(line)]
    assert offenders == []
