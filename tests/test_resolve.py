"""Tests for reference_trainers.config.resolve: per-device ``auto`` resolution and unhonourable flags.

CUDA and MPS are simulated by monkeypatching the capability probes in
``reference_trainers.runtime.device``: ``torch.device('cuda')`` is only a descriptor and can be
built without a GPU, and ``resolve_config`` creates no tensors.
"""

from __future__ import annotations

import pytest
import torch

import reference_trainers.runtime.device as dev
from reference_trainers.config.schema import ConfigError, TrainConfig, build_config
from reference_trainers.config.flags import update_rows
from reference_trainers.config.resolve import Resolution, optimisation_summary, resolve_config

AUTO_FLAGS = [
    "amp", "amp_dtype", "matmul_precision", "tf32", "compile_model", "compile_train_step",
    "cuda_graphs", "pinned_memory", "non_blocking", "optimizer_impl", "torch_threads",
]
ALL_AUTO = [f"optimizations.{name}=auto" for name in AUTO_FLAGS] + ["env.vectorization=auto"]


def resolve(*overrides: str, device: str = "cpu") -> Resolution:
    return resolve_config(build_config({}, [f"device={device}", *overrides]))


def resolve_error(*overrides: str, device: str = "cpu") -> str:
    with pytest.raises(ConfigError) as info:
        resolve(*overrides, device=device)
    message = str(info.value)
    assert "\n" not in message, f"not one line: {message!r}"
    return message


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Ampere-class CUDA GPU with bf16 and TF32, as seen by the device module."""
    monkeypatch.setattr(dev, "cuda_available", lambda: True)
    monkeypatch.setattr(dev, "mps_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dev, "supports_bf16", lambda device: device.type in ("cuda", "cpu"))
    monkeypatch.setattr(dev, "supports_tf32", lambda device: device.type == "cuda")
    monkeypatch.setattr(dev, "supports_fp16_autocast", lambda device: True)
    monkeypatch.setattr(dev, "device_name", lambda device: "Fake A100" if device.type == "cuda" else "cpu")


@pytest.fixture
def fake_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "cuda_available", lambda: False)
    monkeypatch.setattr(dev, "mps_available", lambda: True)
    monkeypatch.setattr(dev, "supports_bf16", lambda device: True)
    monkeypatch.setattr(dev, "device_name", lambda device: "Apple MPS (fake)")


# --------------------------------------------------------------------------- auto on CPU


def test_auto_flags_resolve_to_concrete_cpu_values_with_reasons() -> None:
    result = resolve(*ALL_AUTO)
    o = result.config.optimizations
    assert result.device == torch.device("cpu")
    assert result.config.device == "cpu"
    expected = {
        "amp": False, "compile_model": False, "compile_train_step": False, "pinned_memory": False,
        "non_blocking": False, "tf32": False, "cuda_graphs": False, "matmul_precision": "highest",
        "amp_dtype": "bfloat16", "torch_threads": 1,
    }
    for name, value in expected.items():
        assert getattr(o, name) == value and type(getattr(o, name)) is type(value), name
    # No flag is left at auto in the resolved config.
    for name in AUTO_FLAGS:
        assert getattr(o, name) != "auto", name
    assert result.config.env.vectorization != "auto"
    # Every auto is explained, and the reason starts with the value chosen.
    for name in AUTO_FLAGS:
        reason = result.reasons[f"optimizations.{name}"]
        assert reason.startswith(f"{getattr(o, name)} ("), reason


@pytest.mark.skipif(tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 4), reason="fused CPU Adam needs torch 2.4")
def test_optimizer_impl_auto_is_fused_on_cpu() -> None:
    result = resolve("optimizations.optimizer_impl=auto")
    assert result.config.optimizations.optimizer_impl == "fused"
    assert result.reasons["optimizations.optimizer_impl"].startswith("fused")


def test_optimizer_impl_auto_falls_back_to_foreach_without_fused_adam(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "supports_fused_adam", lambda device: False)
    result = resolve("optimizations.optimizer_impl=auto")
    assert result.config.optimizations.optimizer_impl == "foreach"


@pytest.mark.parametrize(("sizes", "threads"), [("[64,64]", 1), ("[256]", 1), ("[16,512]", None), ("[1024,1024]", None)])
def test_torch_threads_auto_is_one_for_small_mlps_and_default_for_large(sizes: str, threads: int | None) -> None:
    result = resolve("optimizations.torch_threads=auto", f"model.hidden_sizes={sizes}")
    assert result.config.optimizations.torch_threads == threads
    assert "optimizations.torch_threads" in result.reasons


@pytest.mark.parametrize(("algo", "overrides", "rows", "threads"), [
    ("ppo", [], 128 * 4 // 4, 1),
    ("dqn", ["dqn.batch_size=512"], 512, 1),
    ("iqn", ["iqn.batch_size=32", "iqn.num_tau_samples=64"], 2048, None),   # the iqn-cartpole update
    ("iqn", ["iqn.batch_size=8", "iqn.num_tau_samples=8"], 64, 1),
])
def test_torch_threads_auto_counts_the_rows_of_an_update(algo: str, overrides: list[str], rows: int,
                                                         threads: int | None) -> None:
    """IQN pushes batch x N fractions through the network: a small MLP, but a large update."""
    base = ["env.num_envs=4", "ppo.num_steps=128", "ppo.num_minibatches=4"] if algo == "ppo" else []
    config = build_config({}, ["device=cpu", f"algo={algo}", *base, *overrides])
    assert update_rows(config) == rows
    result = resolve(f"algo={algo}", *base, *overrides, "optimizations.torch_threads=auto")
    assert result.config.optimizations.torch_threads == threads
    assert f"{rows}x64" in result.reasons["optimizations.torch_threads"]


@pytest.mark.parametrize(("env_id", "mode"), [("CartPole-v1", "native"), ("Acrobot-v1", "sync")])
def test_vectorization_auto_is_env_aware_and_explained(env_id: str, mode: str) -> None:
    result = resolve("env.vectorization=auto", f"env.id={env_id}")
    assert result.config.env.vectorization == mode
    assert result.reasons["env.vectorization"].startswith(f"{mode} (")
    assert env_id in result.reasons["env.vectorization"]


def test_vectorization_auto_with_action_repeat_is_sync() -> None:
    result = resolve("env.vectorization=auto", "env.action_repeat=2")
    assert result.config.env.vectorization == "sync"
    assert "action_repeat" in result.reasons["env.vectorization"]


def test_explicit_values_are_kept_and_not_explained() -> None:
    result = resolve("optimizations.optimizer_impl=foreach", "env.vectorization=sync", "optimizations.torch_threads=2")
    assert result.config.optimizations.optimizer_impl == "foreach"
    assert result.config.env.vectorization == "sync"
    assert result.config.optimizations.torch_threads == 2
    # Only auto values get a reason; amp_dtype/matmul stay as written or resolve from their own auto.
    assert "optimizations.optimizer_impl" not in result.reasons
    assert "env.vectorization" not in result.reasons
    assert "optimizations.torch_threads" not in result.reasons


def test_resolve_does_not_modify_the_input_config() -> None:
    config = build_config({}, ["device=cpu", *ALL_AUTO])
    before = config.model_dump()
    resolve_config(config)
    assert config.model_dump() == before
    assert config.optimizations.amp == "auto"


def test_device_auto_records_the_concrete_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "cuda_available", lambda: False)
    monkeypatch.setattr(dev, "mps_available", lambda: False)
    result = resolve(device="auto")
    assert result.device == torch.device("cpu")
    assert result.config.device == "cpu"


def test_resolved_config_is_still_valid() -> None:
    result = resolve(*ALL_AUTO)
    assert TrainConfig.model_validate(result.config.model_dump()) == result.config


# --------------------------------------------------------------------------- unhonourable on CPU


@pytest.mark.parametrize("flag", ["cuda_graphs", "pinned_memory", "non_blocking", "tf32"])
def test_cuda_only_flag_set_true_on_cpu_names_flag_and_device(flag: str) -> None:
    message = resolve_error(f"optimizations.{flag}=true")
    assert message.startswith(f"optimizations.{flag}:")
    assert "CUDA" in message and "cpu" in message
    assert "false" in message  # what is accepted here


def test_bfloat16_amp_rejected_where_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "supports_bf16", lambda device: False)
    message = resolve_error("optimizations.amp=true", "optimizations.amp_dtype=bfloat16")
    assert message.startswith("optimizations.amp_dtype:")
    assert "'bfloat16'" in message and dev.device_name(torch.device("cpu")) in message
    assert "float16" in message.partition("accepted")[2]


def test_amp_dtype_auto_falls_back_to_float16_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "supports_bf16", lambda device: False)
    result = resolve("optimizations.amp_dtype=auto")
    assert result.config.optimizations.amp_dtype == "float16"


def test_float16_amp_rejected_where_fp16_autocast_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "supports_fp16_autocast", lambda device: False)
    message = resolve_error("optimizations.amp=true", "optimizations.amp_dtype=float16")
    assert message.startswith("optimizations.amp_dtype:") and "'float16'" in message and "cpu" in message


def test_fused_optimizer_rejected_where_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "supports_fused_adam", lambda device: False)
    message = resolve_error("optimizations.optimizer_impl=fused")
    assert message.startswith("optimizations.optimizer_impl:")
    assert "'fused'" in message and "cpu" in message and "forloop" in message and "foreach" in message


def test_compile_mode_without_compile_model_is_rejected() -> None:
    message = resolve_error("optimizations.compile_mode=max-autotune")
    assert message.startswith("optimizations.compile_mode:")
    assert "'max-autotune'" in message and "compile_model" in message


def test_inference_batch_size_without_batch_inference_is_rejected() -> None:
    message = resolve_error("optimizations.inference_batch_size=4")
    assert message.startswith("optimizations.inference_batch_size:") and "batch_inference" in message


def test_inference_batch_size_larger_than_num_envs_is_rejected() -> None:
    message = resolve_error("optimizations.batch_inference=true", "optimizations.inference_batch_size=9", "env.num_envs=8")
    assert message.startswith("optimizations.inference_batch_size:")
    assert "9" in message and "env.num_envs=8" in message and "1..8" in message


def test_inference_batch_size_within_num_envs_is_kept() -> None:
    result = resolve("optimizations.batch_inference=true", "optimizations.inference_batch_size=8", "env.num_envs=8")
    assert result.config.optimizations.inference_batch_size == 8


def test_num_minibatches_must_divide_the_batch() -> None:
    message = resolve_error("env.num_envs=8", "ppo.num_steps=128", "ppo.num_minibatches=3")
    assert message.startswith("ppo.num_minibatches:")
    assert "3" in message and "1024" in message


def test_unknown_env_id_is_config_error_naming_env_id() -> None:
    message = resolve_error("env.id=CartPol-v1")
    assert message.startswith("env.id:")
    assert "'CartPol-v1'" in message and "CartPole-v1" in message  # the close match is suggested


def test_native_vectorization_with_action_repeat_is_config_error() -> None:
    message = resolve_error("env.vectorization=native", "env.action_repeat=2")
    assert message.startswith("env.vectorization:")


# --------------------------------------------------------------------------- simulated CUDA / MPS


def test_auto_flags_turn_on_the_cuda_path(fake_cuda: None) -> None:
    result = resolve(*ALL_AUTO, device="cuda")
    o = result.config.optimizations
    assert result.device.type == "cuda"
    assert result.config.device == "cuda"
    assert o.amp is True and o.amp_dtype == "bfloat16"
    assert o.compile_model is True and o.compile_train_step is True
    assert o.pinned_memory is True and o.non_blocking is True
    assert o.tf32 is True and o.matmul_precision == "high"
    assert o.optimizer_impl == "fused"
    assert o.cuda_graphs is False  # opt-in even on CUDA
    assert o.torch_threads is None
    assert all(f"optimizations.{name}" in result.reasons for name in AUTO_FLAGS)


def test_device_auto_prefers_cuda_over_cpu(fake_cuda: None) -> None:
    result = resolve("optimizations.amp=auto", device="auto")
    assert result.device.type == "cuda"
    assert result.config.optimizations.amp is True


def test_amp_auto_on_cuda_without_bf16_uses_float16(fake_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "supports_bf16", lambda device: False)
    result = resolve("optimizations.amp=auto", device="cuda")
    assert result.config.optimizations.amp is True
    assert result.config.optimizations.amp_dtype == "float16"
    assert dev.amp_dtype(result.config) is torch.float16


def test_tf32_rejected_on_pre_ampere_cuda(fake_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "supports_tf32", lambda device: False)
    message = resolve_error("optimizations.tf32=true", device="cuda")
    assert message.startswith("optimizations.tf32:") and "Fake A100" in message
    assert resolve("optimizations.tf32=auto", device="cuda").config.optimizations.tf32 is False


@pytest.mark.parametrize("flag", ["cuda_graphs", "pinned_memory", "non_blocking"])
def test_cuda_only_flags_are_honoured_on_cuda(fake_cuda: None, flag: str) -> None:
    result = resolve(f"optimizations.{flag}=true", device="cuda")
    assert getattr(result.config.optimizations, flag) is True


def test_cuda_graphs_with_float16_amp_is_rejected(fake_cuda: None) -> None:
    message = resolve_error(
        "optimizations.cuda_graphs=true", "optimizations.amp=true", "optimizations.amp_dtype=float16", device="cuda"
    )
    assert message.startswith("optimizations.cuda_graphs:") and "float16" in message and "bfloat16" in message


def test_cuda_graphs_with_bfloat16_amp_is_accepted(fake_cuda: None) -> None:
    result = resolve("optimizations.cuda_graphs=true", "optimizations.amp=true", "optimizations.amp_dtype=bfloat16", device="cuda")
    assert result.config.optimizations.cuda_graphs is True and result.config.optimizations.amp is True


def test_cuda_graphs_with_skip_update_nan_policy_is_rejected(fake_cuda: None) -> None:
    message = resolve_error("optimizations.cuda_graphs=true", "stability.nan_policy=skip_update", device="cuda")
    assert message.startswith("optimizations.cuda_graphs: true cannot be used here") and "'skip_update'" in message


def test_cuda_graphs_with_explicit_compile_train_step_is_rejected(fake_cuda: None) -> None:
    message = resolve_error("optimizations.cuda_graphs=true", "optimizations.compile_train_step=true", device="cuda")
    assert "cuda_graphs" in message and "compile_train_step" in message



def test_auto_compile_train_step_yields_to_explicit_cuda_graphs(fake_cuda: None) -> None:
    # The optimized presets set compile_train_step: auto; adding --set optimizations.cuda_graphs=true must work.
    result = resolve("optimizations.cuda_graphs=true", "optimizations.compile_train_step=auto", device="cuda")
    assert result.config.optimizations.cuda_graphs is True
    assert result.config.optimizations.compile_train_step is False



@pytest.mark.parametrize(("algo", "compiled"), [("ppo", True), ("dqn", True), ("iqn", False)])
def test_auto_compile_train_step_stays_eager_for_iqn_on_cuda(fake_cuda: None, algo: str, compiled: bool) -> None:
    result = resolve(f"algo={algo}", "optimizations.compile_train_step=auto", device="cuda")
    assert result.config.optimizations.compile_train_step is compiled
    if not compiled:
        assert "drifts" in result.reasons["optimizations.compile_train_step"]
    explicit = resolve(f"algo={algo}", "optimizations.compile_train_step=true", device="cuda")
    assert explicit.config.optimizations.compile_train_step is True  # an explicit request is honoured


def test_auto_amp_yields_to_explicit_cuda_graphs_without_bf16(fake_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "supports_bf16", lambda device: False)
    result = resolve("optimizations.cuda_graphs=true", "optimizations.amp=auto", device="cuda")
    assert result.config.optimizations.cuda_graphs is True
    assert result.config.optimizations.amp is False


def test_mps_auto_keeps_cuda_only_paths_off(fake_mps: None) -> None:
    result = resolve(*ALL_AUTO, device="auto")
    o = result.config.optimizations
    assert result.device.type == "mps"
    assert o.pinned_memory is False and o.non_blocking is False and o.tf32 is False and o.cuda_graphs is False
    assert o.torch_threads is None  # thread count is a CPU setting


def test_cuda_graphs_on_mps_names_the_mps_device(fake_mps: None) -> None:
    message = resolve_error("optimizations.cuda_graphs=true", device="mps")
    assert message.startswith("optimizations.cuda_graphs:") and "mps" in message


# --------------------------------------------------------------------------- summary


def test_optimisation_summary_is_one_line_of_the_plain_path() -> None:
    line = optimisation_summary(resolve().config)
    assert line.startswith("Optimisations:") and "\n" not in line
    tokens = line.split()
    for part in ["device=cpu", "vectorization=serial", "batch_inference=off", "compile_model=off",
                 "compile_train_step=off", "optimizer_impl=forloop", "torch_threads=default", "amp=off"]:
        assert part in tokens, part
    assert not any(t.endswith("=on") for t in tokens)
    assert "pinned_memory=off" not in tokens  # a CUDA-only flag is left out on the CPU


def test_optimisation_summary_reflects_flags_in_force(fake_cuda: None) -> None:
    result = resolve(
        *ALL_AUTO, "optimizations.batch_inference=true", "optimizations.sync_free_logging=true",
        "optimizations.torch_threads=3", device="cuda",
    )
    line = optimisation_summary(result.config)
    assert line.startswith("Optimisations:") and "\n" not in line
    for part in ["device=cuda", "vectorization=native", "batch_inference=on", "amp=on", "amp_dtype=bfloat16",
                 "compile_model=on", "compile_train_step=on", "matmul_precision=high", "tf32=on",
                 "optimizer_impl=fused", "pinned_memory=on", "non_blocking=on", "sync_free_logging=on", "torch_threads=3"]:
        assert part in line.split(), part


def test_optimisation_summary_shows_fp16_and_step_only_compile() -> None:
    config = resolve("optimizations.amp=true", "optimizations.amp_dtype=float16", "optimizations.compile_train_step=true").config
    line = optimisation_summary(config)
    assert {"amp=on", "amp_dtype=float16", "compile_model=off", "compile_train_step=on"} <= set(line.split())
    assert dev.amp_dtype(config) is torch.float16


# --------------------------------------------------------------------------- budget-aware compile

CPU_HAND_WRITTEN = ["optimizations.analytic_grads=true", "optimizations.compile_train_step=auto",
                    "tuning.compile_break_even_env_steps=100000"]


@pytest.mark.parametrize(("run", "compiles"), [
    (["run.warmup_steps=0", "run.repeats=1", "run.steps=99999"], False),
    (["run.warmup_steps=1", "run.repeats=1", "run.steps=99999"], True),  # warm-up counts toward the budget
    (["run.warmup_steps=0", "run.repeats=4", "run.steps=25000"], True),  # so does every repeat
])
def test_auto_compile_of_the_cpu_hand_written_step_weighs_the_run_budget(run: list[str], compiles: bool) -> None:
    result = resolve(*CPU_HAND_WRITTEN, *run)
    assert result.config.optimizations.compile_train_step is compiles
    reason = result.reasons["optimizations.compile_train_step"]
    assert "budget of" in reason and "compile_break_even_env_steps = 100,000" in reason
    assert ("pays for" in reason) is compiles


def test_the_standalone_trainer_budget_is_its_steps_argument(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from reference_trainers.runtime import trainer as standalone

    seen = []

    class Stub:
        env_steps = 0

        def iterate(self) -> None:
            self.env_steps += 1000

        def close(self) -> None:
            pass

        def mean_recent_return(self) -> None:
            return None

        tracker = type("T", (), {"completed": 0})()
        last_stats: dict = {}

    def build(config: TrainConfig) -> Stub:
        seen.append(resolve_config(config))
        return Stub()

    path = tmp_path / "c.yaml"
    path.write_text("device: cpu\n", encoding="utf-8")
    sets = [a for s in CPU_HAND_WRITTEN for a in ("--set", s)]
    for steps in (99_999, 100_000):
        assert standalone.train_from_command_line(build, "loss", ["--config", str(path), "--steps", str(steps), *sets],
                                                  "ppo", None) == 0
    assert [r.config.optimizations.compile_train_step for r in seen] == [False, True]
