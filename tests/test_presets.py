"""Shipped presets (``harness/specs/presets/*.yaml``): two variants that differ only in
implementation flags, a baseline that is every plain path, and valid configs for both.

Iterates over the preset directory, so a preset added later is checked the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import yaml

from conftest import TINY
from harness.errors import UserError
from harness.specs.presets import (PRESET_DIR, VARIANTS, left_out, list_presets, load_preset, preset_names, specs_for,
                                   variant_names)
from harness.measurement.runner import run_variants
from reference_trainers.envs.atari import register_atari_envs
from reference_trainers.config.schema import ConfigError, OptimizationsConfig
from reference_trainers.config.resolve import resolve_config

SHIPPED = sorted(PRESET_DIR.glob("*.yaml"))
NAMES = sorted(path.stem for path in SHIPPED)

IMPLEMENTATION_KEYS = ("env.vectorization", "optimizations.")
"""Dotted keys a variant may set: everything else is an algorithmic setting shared by both."""


def _continuous(name: str) -> bool:
    register_atari_envs()
    env = gym.make(yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text(encoding="utf-8"))["config"]["env"]["id"])
    try:
        return isinstance(env.action_space, gym.spaces.Box)
    finally:
        env.close()


PIXEL_PRESETS = {name for name in NAMES if name.endswith("-pong")}
"""Atari presets train a Nature CNN: their tiny-size runs take minutes on 2 CPU cores."""
TINY_ALGO_SIZES = {"iqn": ["iqn.batch_size=8", "iqn.num_tau_samples=8", "iqn.num_tau_prime_samples=8",
                            "iqn.num_quantile_samples=8"]}
"""IQN's pairwise quantile loss at its preset sizes makes a tiny Pong run take minutes on 2 cores."""
TINY_PRESET_SIZES = {name: [f"{name.split('-')[0]}.log_interval=64"] for name in NAMES
                     if name.endswith("-gpu") and not name.startswith("ppo-")}
"""A GPU preset's log_interval spans a vector step of its thousands of sub-envs: thousands of steps at 2 envs."""
TINY_PRESET_SIZES.update({name: [f"{name.split('-')[0]}.log_interval=16", f"{name.split('-')[0]}.learning_starts=16"]
                          for name in NAMES if name.endswith("-pong") and not name.startswith("ppo-")})
"""A value-based Pong iteration is log_interval agent steps of CNN acting and updates: a few, not hundreds."""
RUNNABLE = [pytest.param(name, marks=pytest.mark.slow) if name in PIXEL_PRESETS else name for name in NAMES]


def _leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for key, child in value.items():
            yield from _leaves(child, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


def _is_implementation_key(key: str) -> bool:
    return key == "env.vectorization" or key.startswith("optimizations.") or key == "optimizations"


def _raw(name: str) -> dict[str, Any]:
    return yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text(encoding="utf-8"))



def test_presets_ship_inside_the_package_and_include_ppo_cartpole() -> None:
    assert PRESET_DIR.parent.parent.name == "harness"
    assert "ppo-cartpole" in NAMES
    assert preset_names() == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_preset_file_has_description_shared_config_and_both_variants(name: str) -> None:
    raw = _raw(name)
    assert set(raw) - {"on_device"} == {"description", "config", "variants"}  # on_device: optional
    assert isinstance(raw["description"], str) and raw["description"].strip()
    assert "\n" not in raw["description"].strip()  # one line in `rlgauge presets`
    assert set(raw["variants"]) == set(VARIANTS) == {"baseline", "optimized"}
    assert name.startswith(f"{raw['config']['algo']}-")  # <algo>-<env>


@pytest.mark.parametrize("name", NAMES)
def test_preset_variants_override_only_implementation_keys(name: str) -> None:
    for variant, overrides in _raw(name)["variants"].items():
        keys = [key for key, _ in _leaves(overrides or {})]
        foreign = [key for key in keys if key and not _is_implementation_key(key)]
        assert foreign == [], f"{name}/{variant} changes algorithmic settings {foreign}"


@pytest.mark.parametrize("name", NAMES)
def test_preset_shared_config_sets_no_implementation_flag(name: str) -> None:
    shared = [key for key, _ in _leaves(_raw(name)["config"]) if _is_implementation_key(key)]
    assert shared == [], f"{name}: implementation flags belong in the variants, not the shared config: {shared}"


@pytest.mark.parametrize("name", NAMES)
def test_preset_builds_and_resolves_both_variants_on_cpu(name: str) -> None:
    specs = specs_for(name, "both", ["device=cpu"])
    assert [spec.variant for spec in specs] == ["baseline", "optimized"]
    for spec in specs:
        assert spec.preset == name
        resolved = resolve_config(spec.config).config
        assert resolved.device == "cpu"
        assert "auto" not in str(resolved.model_dump(mode="json"))


@pytest.mark.parametrize("name", NAMES)
def test_preset_variants_share_every_algorithmic_setting(name: str) -> None:
    baseline, optimized = (resolve_config(spec.config).config.model_dump(mode="json")
                           for spec in specs_for(name, "both", ["device=cpu"]))
    base_leaves, opt_leaves = dict(_leaves(baseline)), dict(_leaves(optimized))
    assert base_leaves.keys() == opt_leaves.keys()
    differing = sorted(key for key in base_leaves if base_leaves[key] != opt_leaves[key])
    assert all(_is_implementation_key(key) for key in differing), differing
    assert "optimizations.batch_inference" in differing  # the optimised variant does optimise


PLAIN = OptimizationsConfig().model_dump(mode="json")


@pytest.mark.parametrize("name", NAMES)
def test_preset_baseline_is_every_plain_path(name: str) -> None:
    (spec,) = specs_for(name, "baseline", ["device=cpu"])
    resolved = resolve_config(spec.config).config
    o = resolved.optimizations
    assert resolved.env.vectorization == "serial"
    assert resolved.env.action_repeat == 1
    assert o.batch_inference is False and o.inference_batch_size is None
    assert o.amp is False
    assert o.compile_model is False and o.compile_train_step is False and o.compile_mode == "default"
    assert o.optimizer_impl == "forloop"
    assert o.sync_free_logging is False
    assert o.torch_threads is None
    assert o.matmul_precision == "highest" and o.tf32 is False
    assert o.pinned_memory is False and o.non_blocking is False and o.cuda_graphs is False
    # every flag at its plain default (amp_dtype only says which dtype amp *would* use)
    resolved_flags = {k: v for k, v in resolved.model_dump(mode="json")["optimizations"].items() if k != "amp_dtype"}
    assert resolved_flags == {k: v for k, v in PLAIN.items() if k != "amp_dtype"}


@pytest.mark.parametrize("name", NAMES)
def test_preset_optimized_variant_on_cpu_batches_inference(name: str) -> None:
    (spec,) = specs_for(name, "optimized", ["device=cpu"])
    resolution = resolve_config(spec.config)
    o = resolution.config.optimizations
    assert o.batch_inference is True
    assert o.sync_free_logging is True
    assert o.pinned_memory is False and o.non_blocking is False  # CUDA-only flags resolve off on the CPU
    assert resolution.config.env.vectorization != "auto"
    assert "env.vectorization" in resolution.reasons  # the auto choice is explained


@pytest.mark.parametrize("name", RUNNABLE)
def test_preset_runs_both_variants_at_tiny_size_ok_and_float32_only(name: str) -> None:
    # one torch thread: beside the other test workers, a second thread only spins
    overrides = [*TINY, "optimizations.torch_threads=1", *TINY_ALGO_SIZES.get(name.split("-")[0], []),
                 *TINY_PRESET_SIZES.get(name, [])]
    results, interrupted = run_variants(specs_for(name, "both", overrides), say=lambda _text: None)
    assert interrupted is False
    assert [r.variant for r in results] == ["baseline", "optimized"]
    for result in results:
        assert result.status == "ok", result.error
        assert result.stability["float64_ops"] == 0, result.stability
        assert result.stability["nonfinite_events"] == 0
        assert result.metrics["env_steps_per_sec"]["median"] > 0


def test_list_presets_gives_each_shipped_preset_with_description_and_variants() -> None:
    presets = list_presets()
    assert [p.name for p in presets] == NAMES
    for preset in presets:
        assert preset.description == _raw(preset.name)["description"]
        assert tuple(preset.variants) == VARIANTS


def test_a_preset_file_given_by_path_loads_like_a_shipped_one() -> None:
    by_path = load_preset(str(PRESET_DIR / "ppo-cartpole.yaml"))
    by_name = load_preset("ppo-cartpole")
    assert by_path == by_name


def test_unknown_preset_is_a_user_error_with_a_suggestion() -> None:
    with pytest.raises(UserError, match="did you mean 'ppo-cartpole'"):
        load_preset("ppo-cartpol")
    with pytest.raises(UserError, match="available: .*ppo-cartpole"):
        load_preset("zzz")


def _preset_file(tmp_path: Path, variants: dict[str, Any]) -> str:
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump({"description": "d", "config": {}, "variants": variants}, sort_keys=False),
                    encoding="utf-8")
    return str(path)


def test_variant_selects_any_name_the_file_defines_a_list_all_or_both(tmp_path: Path) -> None:
    path = _preset_file(tmp_path, {"baseline": {}, "optimized": {}, "fast": {"env": {"num_envs": 4}}})
    assert [s.variant for s in specs_for(path, "fast,baseline", [])] == ["fast", "baseline"]  # the reference first
    assert [s.variant for s in specs_for(path, "all", [])] == ["baseline", "optimized", "fast"]
    assert [s.variant for s in specs_for(path, "both", [])] == ["baseline", "optimized"]
    assert specs_for(path, "fast", [])[0].config.env.num_envs == 4
    preset = load_preset(path)
    assert left_out(preset, variant_names(preset, "both")) == ["fast"]
    with pytest.raises(UserError, match=r"--variant baseline,slow: three defines no variant 'slow'; defined: "
                                        r"baseline, optimized, fast; or both or all"):
        specs_for(path, "baseline,slow", [])
    with pytest.raises(UserError, match="fast is named twice"):
        specs_for(path, "fast,fast", [])


def test_all_puts_baseline_first_wherever_the_file_defines_it(tmp_path: Path) -> None:
    preset = load_preset(_preset_file(tmp_path, {"fast": {}, "baseline": {}, "slow": {}}))
    assert variant_names(preset, "all") == ["baseline", "fast", "slow"]


def test_a_plain_config_file_is_one_run_named_config(tmp_path: Path) -> None:
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump({"algo": "ppo"}), encoding="utf-8")
    for selection in ("both", "all", "config", "optimized"):
        assert [s.variant for s in specs_for(str(path), selection, [])] == ["config"]
    with pytest.raises(UserError, match="--variant fast: plain has no variants: section"):
        specs_for(str(path), "fast", [])


def test_variant_a_preset_does_not_have_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "only.yaml"
    path.write_text(yaml.safe_dump({"description": "d", "config": {}, "variants": {"baseline": {}}}), encoding="utf-8")
    with pytest.raises(UserError, match="optimized"):
        specs_for(str(path), "optimized", [])
    assert [s.variant for s in specs_for(str(path), "both", [])] == ["baseline"]


@pytest.mark.parametrize("content, needle", [
    ({"description": "d", "config": {}, "variants": {}}, "variants must map"),
    ({"description": "d", "config": {}, "variants": {"baseline": 3}}, "variants must map"),
    ({"description": "d", "config": [1], "variants": {"baseline": {}}}, "config must be a mapping"),
    ({"description": "d", "config": {}, "variants": {"baseline": {}}, "extra": 1}, "unknown top-level key 'extra'"),
    ({"description": "d", "config": {}, "variants": {"baseline": {}}, "on_device": [1]}, "on_device must be a mapping"),
    ({"description": "d", "config": {}, "variants": {"baseline": {}}, "on_device": {"tpu": {}}},
     "unknown device kind 'tpu'"),
    ({"description": "d", "config": {}, "variants": {"baseline": {}}, "on_device": {"cuda": {"fast": {}}}},
     "no variant 'fast'"),
    ({"description": "d", "config": {}, "variants": {"baseline": {}}, "on_device": {"cuda": {"baseline": 1}}},
     "on_device.cuda must map variants"),
])
def test_malformed_preset_file_is_a_config_error(content: dict[str, Any], needle: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(content), encoding="utf-8")
    with pytest.raises(ConfigError, match=needle):
        specs_for(str(path), "both", [])
