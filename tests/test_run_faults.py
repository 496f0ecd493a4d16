"""Faults inside training reach the result file: a torch.compile failure falls back once and is
recorded; a NaN loss in DQN/IQN follows ``stability.nan_policy`` and is counted."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.cli import main
from reference_trainers.value import dqn as dqn_mod
from reference_trainers.value import iqn as iqn_mod
from value_trainers import tiny as value_tiny
from conftest import TINY


def _run(tmp_path: Path, target: str, *overrides: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "r.json"
    argv = ["run", target, "--variant", "baseline", "--quiet", "--out", str(out)]
    for item in overrides:
        argv += ["--set", item]
    code = main(argv)
    (run,) = json.loads(out.read_text(encoding="utf-8"))["runs"]
    return code, run


def _failing_compile(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``torch.compile`` gives callables that raise when called (as Inductor does without a C++ compiler)."""
    compiled: list[str] = []

    def compile_that_fails(fn: Any, **kwargs: Any) -> Any:
        compiled.append(getattr(fn, "__name__", type(fn).__name__))

        def broken(*args: Any, **kw: Any) -> Any:
            raise RuntimeError("InductorError: planted compile failure\nwith a second line")
        return broken

    monkeypatch.setattr(torch, "compile", compile_that_fails)
    return compiled


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_compile_failure_falls_back_once_per_compiled_function_and_is_recorded(
        algo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rlgauge")
    compiled = _failing_compile(monkeypatch)
    overrides = TINY if algo == "ppo" else value_tiny(algo)
    code, run = _run(tmp_path, f"{algo}-cartpole", *overrides, "optimizations.compile_model=true",
                     "optimizations.compile_train_step=true")
    assert compiled, "torch.compile was never asked for"
    warnings = [r.getMessage() for r in caplog.records if "torch.compile of" in r.getMessage()]
    assert len(warnings) == len(compiled)  # once per compiled function, not once per call
    assert all("planted compile failure" in w and "\n" not in w for w in warnings)
    assert run["stability"]["compile_fallback"] is True
    assert run["status"] == "ok" and code == 0  # eager results are still valid; `gate` flags the fallback
    assert run["metrics"]["env_steps_per_sec"]["median"] > 0


def test_without_a_compile_failure_no_fallback_is_recorded(tmp_path: Path) -> None:
    code, run = _run(tmp_path, "ppo-cartpole", *TINY)
    assert code == 0 and run["stability"]["compile_fallback"] is False


@pytest.fixture
def nan_value_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    real_td, real_qh = dqn_mod.td_loss, iqn_mod.quantile_huber_loss
    monkeypatch.setattr(dqn_mod, "td_loss", lambda *a: (real_td(*a)[0] * float("nan"), real_td(*a)[1]))
    monkeypatch.setattr(iqn_mod, "quantile_huber_loss", lambda *a: real_qh(*a) * float("nan"))


@pytest.mark.parametrize("algo", ["dqn", "iqn"])
@pytest.mark.parametrize(("policy", "status", "code"), [("raise", "failed", 1), ("skip_update", "unstable", 1),
                                                        ("warn", "unstable", 1)])
def test_a_nan_loss_in_value_based_training_follows_nan_policy_and_is_recorded(
        algo: str, policy: str, status: str, code: int, tmp_path: Path, nan_value_loss: None) -> None:
    exit_code, run = _run(tmp_path, f"{algo}-cartpole", *value_tiny(algo), f"stability.nan_policy={policy}")
    assert exit_code == code
    assert run["status"] == status
    assert run["stability"]["nonfinite_events"] > 0 and run["stability"]["passed"] is False
    if policy == "raise":
        assert "non-finite" in run["error"] and "nan_policy=raise" in run["error"]
    else:
        assert run["metrics"]["env_steps_per_sec"]["median"] > 0  # measured to the end
