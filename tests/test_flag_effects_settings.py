"""Flag-effect tests of the process-wide settings and AMP, for every trainer (PPO, recurrent PPO, DQN,
IQN): the configured threads and matmul precision are in force while ``iterate()`` runs, and AMP
computes the forward matmuls in its dtype. A trainer that never applies them fails here."""

from __future__ import annotations

import importlib

import pytest
import torch
from flag_effects import (
    matmul_dtypes_of_iterate,
    precision_during_updates,
    running,
    spy,
    threads_during_updates,
)

from reference_trainers.runtime import device as dev

ALL_ALGOS = ("ppo", "ppo-lstm", "dqn", "iqn")



@pytest.mark.flag_effect("optimizations.torch_threads")
@pytest.mark.flag_effect("optimizations.torch_threads", "1")
@pytest.mark.flag_effect("optimizations.torch_threads", "2")
@pytest.mark.parametrize("algo", ALL_ALGOS)
@pytest.mark.parametrize("setting", [None, 1, 2])
def test_torch_threads_are_in_force_while_iterate_runs(algo: str, setting: int | None) -> None:
    """Every update runs on the configured intra-op thread count (null: torch's default)."""
    assert set(threads_during_updates(algo, setting)) == {setting or dev.DEFAULT_THREADS}


@pytest.mark.flag_effect("optimizations.matmul_precision", "high")
@pytest.mark.flag_effect("optimizations.matmul_precision", "medium")
@pytest.mark.parametrize("algo", ALL_ALGOS)
@pytest.mark.parametrize("precision", ["highest", "high", "medium"])
def test_matmul_precision_is_in_force_while_iterate_runs(algo: str, precision: str) -> None:
    """Every update runs under the configured float32 matmul precision."""
    assert set(precision_during_updates(algo, precision)) == {precision}


@pytest.mark.flag_effect("optimizations.amp")
@pytest.mark.flag_effect("optimizations.amp_dtype")
@pytest.mark.flag_effect("optimizations.amp_dtype", "bfloat16")
@pytest.mark.flag_effect("optimizations.amp_dtype", "float16")
@pytest.mark.parametrize("algo", ALL_ALGOS)
@pytest.mark.parametrize("amp_dtype", [None, "bfloat16", "float16"])
def test_amp_runs_the_forward_matmuls_in_the_chosen_dtype(monkeypatch: pytest.MonkeyPatch, algo: str,
                                                          amp_dtype: str | None) -> None:
    """Off: every matmul in float32; on: acting and update matmuls in the AMP dtype (fp16 loss-scaled)."""
    unscaled = spy(monkeypatch, torch.amp.GradScaler, "_unscale_grads_")
    flags = ["optimizations.amp=false"] if amp_dtype is None else ["optimizations.amp=true",
                                                                  f"optimizations.amp_dtype={amp_dtype}"]
    update, acting, updates = matmul_dtypes_of_iterate(algo, *flags)
    low = {None: torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[amp_dtype]
    assert low in update and low in acting
    assert not ({torch.bfloat16, torch.float16} - {low}) & (update | acting)
    if amp_dtype is None:
        assert update == acting == {torch.float32}
    assert len(unscaled) == (updates if amp_dtype == "float16" else 0)


ADAM = importlib.import_module("torch.optim.adam")


@pytest.mark.flag_effect("optimizations.optimizer_impl", "foreach")
@pytest.mark.flag_effect("optimizations.optimizer_impl", "fused")
@pytest.mark.parametrize("algo", ALL_ALGOS)
@pytest.mark.parametrize("impl", ["forloop", "foreach", "fused"])
def test_optimizer_impl_runs_the_chosen_adam_kernel(monkeypatch: pytest.MonkeyPatch, algo: str, impl: str) -> None:
    """Every update runs the chosen Adam kernel (per-tensor loop, multi-tensor or fused) and no other."""
    calls = {"forloop": spy(monkeypatch, ADAM, "_single_tensor_adam"),
             "foreach": spy(monkeypatch, ADAM, "_multi_tensor_adam"),
             "fused": spy(monkeypatch, torch, "_fused_adam_")}
    with running(algo, f"optimizations.optimizer_impl={impl}") as trainer:
        updates = trainer.iterate().updates
    assert updates > 0
    assert {name: len(c) for name, c in calls.items()} == {name: updates if name == impl else 0 for name in calls}
