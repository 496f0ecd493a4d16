"""The GPU-scale presets (``*-gpu``): their small twin's algorithm at thousands of sub-envs, the
hyper-parameters that scale keeping the twin's ratios, and ``on_device`` values that apply on CUDA only.

The CPU side runs here; the CUDA run is skipped without a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from harness.specs.presets import PRESET_DIR, device_kind, load_preset, specs_for
from harness.measurement.runner import run_variants
from reference_trainers.runtime import device as dev
from reference_trainers.config.flags import REGISTRY
from reference_trainers.config.resolve import resolve_config

GPU_PRESETS = sorted(path.stem for path in PRESET_DIR.glob("*-gpu.yaml"))
SCALED = {
    "ppo": {"env.num_envs", "ppo.num_steps", "ppo.anneal_steps"},
    "dqn": {"env.num_envs", "dqn.batch_size", "dqn.gradient_steps", "dqn.buffer_size", "dqn.learning_starts",
            "dqn.exploration_steps", "dqn.log_interval"},
    "iqn": {"env.num_envs", "iqn.batch_size", "iqn.buffer_size", "iqn.learning_starts", "iqn.exploration_steps",
            "iqn.log_interval"},
}
"""The hyper-parameters a GPU preset may scale (each preset's comment says why); ``run.*`` is the
measurement, not the algorithm."""


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, child in value.items():
            out.update(_leaves(child, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _shared(name: str) -> dict[str, Any]:
    return yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text(encoding="utf-8"))["config"]


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Ampere-class CUDA GPU with bf16 and TF32, as the device module sees it."""
    monkeypatch.setattr(dev, "cuda_available", lambda: True)
    monkeypatch.setattr(dev, "mps_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dev, "supports_bf16", lambda device: True)
    monkeypatch.setattr(dev, "supports_tf32", lambda device: device.type == "cuda")
    monkeypatch.setattr(dev, "supports_fp16_autocast", lambda device: True)


def test_there_is_a_gpu_preset_for_ppo_discrete_and_continuous_dqn_and_iqn() -> None:
    assert GPU_PRESETS == ["dqn-cartpole-gpu", "iqn-cartpole-gpu", "ppo-cartpole-gpu", "ppo-pendulum-gpu"]


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_gpu_preset_runs_its_twins_algorithm_and_scales_only_the_declared_keys(name: str) -> None:
    gpu, twin = _leaves(_shared(name)), _leaves(_shared(name.removesuffix("-gpu")))
    algorithmic = {key for key in gpu if not key.startswith("run.")}
    assert algorithmic == {key for key in twin if not key.startswith("run.")}
    changed = {key for key in algorithmic if gpu[key] != twin[key]}
    assert changed <= SCALED[gpu["algo"]], changed - SCALED[gpu["algo"]]
    assert gpu["env.num_envs"] >= 1024


@pytest.mark.parametrize("name", [n for n in GPU_PRESETS if n.startswith("ppo-")])
def test_ppo_gpu_preset_keeps_the_updates_per_rollout_and_the_annealing_horizon_in_updates(name: str) -> None:
    gpu, twin = _shared(name), _shared(name.removesuffix("-gpu"))

    def horizon(config: dict[str, Any]) -> float:  # rollouts until the learning rate reaches zero
        return config["ppo"]["anneal_steps"] / (config["env"]["num_envs"] * config["ppo"]["num_steps"])

    assert horizon(gpu) == pytest.approx(horizon(twin))
    for key in ("num_minibatches", "update_epochs", "learning_rate"):
        assert gpu["ppo"][key] == twin["ppo"][key]


@pytest.mark.parametrize("name", [n for n in GPU_PRESETS if n.split("-")[0] in ("dqn", "iqn")])
def test_value_gpu_preset_keeps_the_replay_ratio_and_the_exploration_horizon_in_updates(name: str) -> None:
    gpu, twin = _shared(name), _shared(name.removesuffix("-gpu"))
    algo = gpu["algo"]

    def samples_per_transition(config: dict[str, Any]) -> float:
        hp = config[algo]
        return hp["batch_size"] * hp["gradient_steps"] / (hp["train_frequency"] * config["env"]["num_envs"])

    def exploration_updates(config: dict[str, Any]) -> float:
        hp = config[algo]
        return hp["exploration_steps"] * hp["gradient_steps"] / (hp["train_frequency"] * config["env"]["num_envs"])

    assert samples_per_transition(gpu) == pytest.approx(samples_per_transition(twin))
    assert exploration_updates(gpu) == pytest.approx(exploration_updates(twin))
    assert gpu[algo]["learning_starts"] >= gpu[algo]["batch_size"]  # a full minibatch before the first update
    assert gpu[algo]["log_interval"] % gpu["env"]["num_envs"] == 0  # whole vector steps per iteration


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_gpu_preset_on_cuda_captures_the_update_and_takes_the_gpu_paths(name: str, fake_cuda: None) -> None:
    baseline, optimized = (resolve_config(spec.config).config for spec in specs_for(name, "both", []))
    assert optimized.device == "cuda"  # device: auto picks the accelerator
    o = optimized.optimizations
    assert o.cuda_graphs is True and o.compile_model is True and o.amp is True and o.amp_dtype == "bfloat16"
    assert o.pinned_memory is True and o.non_blocking is True and o.tf32 is True
    assert o.compile_train_step is False  # the graph captures the update instead
    if optimized.algo != "ppo":
        assert o.replay == "tensor"
    if optimized.env.id == "CartPole-v1":
        assert optimized.env.vectorization == "native"
    assert baseline.optimizations.cuda_graphs is False  # on_device names the optimized variant only


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_gpu_preset_on_cpu_leaves_out_the_cuda_values_and_resolves(name: str) -> None:
    (spec,) = specs_for(name, "optimized", ["device=cpu"])
    resolved = resolve_config(spec.config).config
    assert resolved.optimizations.cuda_graphs is False


def test_a_set_override_wins_over_on_device_values(fake_cuda: None) -> None:
    (spec,) = specs_for("ppo-cartpole-gpu", "optimized", ["optimizations.cuda_graphs=false"])
    assert resolve_config(spec.config).config.optimizations.cuda_graphs is False


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_on_device_values_are_implementation_flags_that_differ_from_the_registry(name: str) -> None:
    for kind, by_variant in load_preset(name).on_device.items():
        for variant, data in by_variant.items():
            for key, value in _leaves(data).items():
                assert key == "env.vectorization" or key.startswith("optimizations."), (kind, variant, key)
                entry = REGISTRY[key]
                assert value != (entry.preset if variant == "optimized" else entry.plain), (kind, variant, key)


def test_on_device_applies_where_the_run_device_is_of_that_kind(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "description": "d", "config": {"algo": "ppo", "env": {"id": "CartPole-v1", "num_envs": 2}},
        "variants": {"baseline": {}, "optimized": {}},
        "on_device": {"cpu": {"optimized": {"optimizations": {"torch_threads": 2}}},
                      "cuda": {"optimized": {"optimizations": {"cuda_graphs": True}}}}}), encoding="utf-8")
    baseline, optimized = specs_for(str(path), "both", ["device=cpu"])
    assert optimized.config.optimizations.torch_threads == 2
    assert baseline.config.optimizations.torch_threads is None
    (auto,) = specs_for(str(path), "optimized", [])  # device: auto on this machine
    assert (auto.config.optimizations.torch_threads == 2) == (device_kind("auto") == "cpu")


def test_device_kind_of_auto_is_the_device_auto_resolves_to(fake_cuda: None) -> None:
    assert device_kind("auto") == "cuda"
    assert device_kind("cuda:1") == "cuda" and device_kind("cpu") == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", GPU_PRESETS)
def test_gpu_preset_optimized_variant_runs_on_cuda_with_its_update_captured(name: str) -> None:
    small = ["device=cuda", "env.num_envs=64", "ppo.num_steps=8", "run.steps=1024", "run.warmup_steps=1024",
             "run.repeats=1", "run.latency_samples=3"]
    algo = name.split("-")[0]
    if algo != "ppo":
        small += [f"{algo}.batch_size=64", f"{algo}.learning_starts=128", f"{algo}.log_interval=64"]
    (result,), interrupted = run_variants(specs_for(name, "optimized", small), say=lambda _text: None)
    assert interrupted is False
    assert result.status == "ok", result.error
    assert result.config["optimizations"]["cuda_graphs"] is True
    assert result.metrics["updates_per_sec"]["median"] > 0
