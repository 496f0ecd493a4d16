"""The ``rlgauge`` command line: in-process through ``harness.cli.main`` and, for the exit
code / no-traceback contract, once through ``python -m harness`` in a real subprocess.

Exit codes (DESIGN.md, Public interfaces): 0 success, 1 a check failed, 2 bad input (one
line on stderr, no traceback), 130 interrupted (partial result written, marked).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

import reference_trainers.ppo.trainer as ppo_module
import reference_trainers.ppo.updates as ppo_updates
from conftest import TINY
from precision_state import float32_matmul_precision
from harness.measurement import machine_state
from harness.cli import main
from reference_trainers.runtime import device as dev
from reference_trainers.paths import numpy_update

REPO_ROOT = Path(__file__).resolve().parent.parent
PRESET_DIR = REPO_ROOT / "harness" / "specs" / "presets"


def sets(overrides: list[str]) -> list[str]:
    """``["a=1", "b=2"]`` -> ``["--set", "a=1", "--set", "b=2"]``."""
    return [arg for item in overrides for arg in ("--set", item)]


TINY_ARGS = sets(TINY)

RUN_RESULT_KEYS = {"preset", "variant", "algo", "status", "started_at", "git", "machine", "config", "metrics",
                   "stability"}
MACHINE_KEYS = {"cpu", "cores", "torch", "device", "device_name"}
METRIC_KEYS = {"env_steps_per_sec", "agent_steps_per_sec", "updates_per_sec", "inference_latency_ms",
               "phase_seconds", "peak_host_rss_mb", "peak_device_mem_mb", "device_utilization_pct",
               "host_syncs_per_step", "warmup_s", "mean_return_last_k"}
RATE_KEYS = ("env_steps_per_sec", "agent_steps_per_sec", "updates_per_sec")
PHASE_KEYS = {"env", "inference", "update", "transfer", "logging"}
STABILITY_KEYS = {"float64_ops", "nonfinite_events", "compile_fallback", "passed"}



def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- one shared successful run

@pytest.fixture(scope="module")
def both_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``rlgauge run ppo-cartpole`` (both variants) at TINY size, two repeats, seed 7; run once per module."""
    threads, precision = torch.get_num_threads(), float32_matmul_precision()
    saved = dev.process_settings()
    out = tmp_path_factory.mktemp("both") / "r.json"
    capture = pytest.MonkeyPatch()
    stdout, stderr = io.StringIO(), io.StringIO()
    capture.setattr(sys, "stdout", stdout)
    capture.setattr(sys, "stderr", stderr)
    # module scope runs before conftest's per-test quiet-machine patch: a busy machine must not cap threads here
    capture.setattr(machine_state, "busy_cores_now", lambda seconds=0.0: 0.0)
    try:
        code = main(["run", "ppo-cartpole", *TINY_ARGS, "--repeats", "2", "--seed", "7", "--out", str(out)])
    finally:
        capture.undo()
        after = torch.get_num_threads(), float32_matmul_precision()
        dev.restore_process_settings(saved)
    yield {"code": code, "out": out, "stdout": stdout.getvalue(), "stderr": stderr.getvalue(),
           "threads_before": threads, "precision_before": precision, "globals_after": after}


def test_run_both_variants_exits_0_and_writes_baseline_then_optimized(both_run: dict[str, Any]) -> None:
    assert both_run["code"] == 0, both_run["stderr"]
    data = read_json(both_run["out"])
    assert data["schema_version"] == 1
    assert [r["variant"] for r in data["runs"]] == ["baseline", "optimized"]
    assert all(r["preset"] == "ppo-cartpole" and r["algo"] == "ppo" for r in data["runs"])
    assert all(r["status"] == "ok" for r in data["runs"])
    assert f"results written to {both_run['out']}" in both_run["stderr"]


def test_run_result_has_every_runresult_key_of_the_design(both_run: dict[str, Any]) -> None:
    for run in read_json(both_run["out"])["runs"]:
        assert RUN_RESULT_KEYS <= set(run), RUN_RESULT_KEYS - set(run)
        assert METRIC_KEYS <= set(run["metrics"]), METRIC_KEYS - set(run["metrics"])
        assert MACHINE_KEYS <= set(run["machine"])
        assert STABILITY_KEYS <= set(run["stability"])
        assert set(run["git"]) >= {"commit", "dirty"} and isinstance(run["git"]["dirty"], bool)
        assert set(run["metrics"]["phase_seconds"]) == PHASE_KEYS
        assert set(run["metrics"]["inference_latency_ms"]) >= {"p50", "p95"}
        assert dt.datetime.fromisoformat(run["started_at"]).tzinfo is not None


def test_run_rates_are_median_min_max_over_one_sample_per_repeat(both_run: dict[str, Any]) -> None:
    for run in read_json(both_run["out"])["runs"]:
        for key in RATE_KEYS:
            block = run["metrics"][key]
            assert set(block) >= {"median", "min", "max", "samples"}
            assert len(block["samples"]) == 2  # --repeats 2
            assert all(s > 0 for s in block["samples"])
            assert block["min"] == min(block["samples"]) and block["max"] == max(block["samples"])
            assert block["min"] <= block["median"] <= block["max"]
        latency = run["metrics"]["inference_latency_ms"]
        assert 0 < latency["p50"] <= latency["p95"]


def test_run_records_a_passed_stability_block_without_float64(both_run: dict[str, Any]) -> None:
    for run in read_json(both_run["out"])["runs"]:
        assert run["stability"]["float64_ops"] == 0
        assert run["stability"]["nonfinite_events"] == 0
        assert run["stability"]["passed"] is True
        assert run["stability"]["compile_fallback"] is False


def test_run_options_are_recorded_in_the_resolved_config(both_run: dict[str, Any]) -> None:
    baseline, optimized = read_json(both_run["out"])["runs"]
    for run in (baseline, optimized):
        assert run["config"]["seed"] == 7
        assert run["config"]["run"]["repeats"] == 2
        assert run["config"]["device"] == "cpu"
        assert run["config"]["env"]["num_envs"] == 2
    assert baseline["config"]["optimizations"]["batch_inference"] is False
    assert optimized["config"]["optimizations"]["batch_inference"] is True
    flat = json.dumps(optimized["config"])
    assert '"auto"' not in flat, "a result must record resolved values, never 'auto'"


def test_run_prints_a_table_with_a_ratio_column_on_stdout(both_run: dict[str, Any]) -> None:
    stdout = both_run["stdout"]
    assert "ratio optimized/baseline" in stdout
    assert "env_steps_per_sec" in stdout and "host_syncs_per_step" in stdout
    assert "ratio" not in both_run["stderr"]


def test_run_announces_the_optimisations_of_each_variant_on_stderr(both_run: dict[str, Any]) -> None:
    lines = [line for line in both_run["stderr"].splitlines() if "Optimisations:" in line]
    assert len(lines) == 2
    assert lines[0].startswith("baseline: Optimisations:") and "batch_inference=off" in lines[0]
    assert lines[1].startswith("optimized: Optimisations:") and "batch_inference=on" in lines[1]


def test_each_result_records_the_thread_count_its_variant_ran_with(both_run: dict[str, Any]) -> None:
    baseline, optimized = read_json(both_run["out"])["runs"]
    assert optimized["config"]["optimizations"]["torch_threads"] == 1
    assert optimized["machine"]["torch_threads"] == 1
    # the baseline runs with torch's default (torch_threads: null) and must say so
    assert baseline["machine"]["torch_threads"] == dev.DEFAULT_THREADS


def test_run_in_process_leaves_torch_thread_count_as_it_found_it(both_run: dict[str, Any]) -> None:
    threads_after, _ = both_run["globals_after"]
    assert threads_after == both_run["threads_before"]



def test_run_in_process_leaves_matmul_precision_as_it_found_it(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    torch.set_float32_matmul_precision("highest")
    code, _, err = run_cli(capsys, "run", "ppo-cartpole", "--variant", "optimized", *TINY_ARGS,
                           "--set", "optimizations.matmul_precision=medium", "--quiet")
    assert code == 0, err
    assert float32_matmul_precision() == "highest"


def test_run_one_variant_gives_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    code, stdout, err = run_cli(capsys, "run", "ppo-cartpole", "--variant", "baseline", *TINY_ARGS,
                                "--out", str(out))
    assert code == 0, err
    runs = read_json(out)["runs"]
    assert [r["variant"] for r in runs] == ["baseline"]
    assert runs[0]["config"]["env"]["vectorization"] == "serial"
    assert "ratio" not in stdout  # no pair, no ratio column
    assert sum("Optimisations:" in line for line in err.splitlines()) == 1


def test_run_quiet_prints_no_optimisation_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, err = run_cli(capsys, "run", "ppo-cartpole", "--variant", "optimized", *TINY_ARGS, "--quiet")
    assert code == 0, err
    assert "Optimisations:" not in err
    assert "env_steps_per_sec" in stdout  # the table still comes


def test_two_quiet_runs_in_one_folder_keep_their_own_trainer_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ``--quiet`` runs without ``--out`` side by side in one folder (two pytest workers, two
    terminals): one that printed nothing ends first and must not remove the other's file, and each
    counts only its own lines."""
    import argparse

    from harness.cli.app import _trainer_stdout

    monkeypatch.chdir(tmp_path)
    quiet = argparse.Namespace(quiet=True, out=None)
    with _trainer_stdout(quiet) as talking:
        print("talking run, line 1")
        with _trainer_stdout(quiet) as silent:
            pass
        print("talking run, line 2")
    assert (talking.lines, silent.lines) == (2, 0)
    assert talking.path == Path("rlgauge-stdout.txt")
    assert Path("rlgauge-stdout.txt").read_text(encoding="utf-8") == "talking run, line 1\ntalking run, line 2\n"
    with _trainer_stdout(quiet) as first:
        print("first")
        with _trainer_stdout(quiet) as second:
            print("second, 1\nsecond, 2")
    assert (first.lines, second.lines) == (1, 2)
    assert Path("rlgauge-stdout.txt").read_text(encoding="utf-8") == "first\n"  # the run that ended last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rlgauge-stdout.txt"]  # no part file left


def test_run_plain_config_file_is_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text(yaml.safe_dump({"env": {"id": "CartPole-v1"}}), encoding="utf-8")
    out = tmp_path / "r.json"
    code, _, err = run_cli(capsys, "run", str(config), *TINY_ARGS, "--out", str(out), "--quiet")
    assert code == 0, err
    runs = read_json(out)["runs"]
    assert len(runs) == 1
    assert runs[0]["preset"] == "mine"
    assert runs[0]["status"] == "ok"
    assert runs[0]["config"]["env"]["id"] == "CartPole-v1"


def test_run_creates_missing_parent_folders_of_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "new" / "deeper" / "r.json"
    code, _, err = run_cli(capsys, "run", "ppo-cartpole", "--variant", "optimized", *TINY_ARGS,
                           "--out", str(out), "--quiet")
    assert code == 0, err
    assert [r["variant"] for r in read_json(out)["runs"]] == ["optimized"]


# --------------------------------------------------------------------------- presets / config

def test_presets_lists_every_shipped_preset_with_its_description(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, err = run_cli(capsys, "presets")
    assert code == 0 and err == ""
    lines = stdout.splitlines()
    shipped = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
    assert "ppo-cartpole" in shipped
    for name in shipped:
        description = yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text(encoding="utf-8"))["description"]
        matching = [line for line in lines if line.split()[0] == name]
        assert len(matching) == 1, f"{name} not listed once in:\n{stdout}"
        assert description.strip() and description.strip() in matching[0]
        assert "baseline" in matching[0] and "optimized" in matching[0]


def _walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _walk(child, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _walk(child, f"{path}[{i}]")
    else:
        yield path, value


def test_config_prints_both_variants_fully_resolved_as_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, err = run_cli(capsys, "config", "ppo-cartpole", "--device", "cpu")
    assert code == 0, err
    documents = list(yaml.safe_load_all(stdout))
    assert len(documents) == 2
    assert "# ppo-cartpole / baseline" in stdout and "# ppo-cartpole / optimized" in stdout
    baseline, optimized = documents
    for document in documents:
        assert document["device"] == "cpu"
        unresolved = [key for key, value in _walk(document) if value == "auto"]
        assert unresolved == [], f"'auto' left in the resolved config at {unresolved}"
        assert set(document["optimizations"]) >= {"batch_inference", "amp", "compile_model", "optimizer_impl",
                                                   "sync_free_logging", "torch_threads", "pinned_memory"}
    assert optimized["optimizations"]["batch_inference"] is True
    assert baseline["optimizations"]["batch_inference"] is False
    assert baseline["env"]["vectorization"] == "serial"
    assert optimized["env"]["vectorization"] in ("sync", "async", "native", "serial")


def test_config_one_variant_and_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, err = run_cli(capsys, "config", "ppo-cartpole", "--variant", "optimized", "--device", "cpu",
                                "--set", "env.num_envs=4", "--seed", "3")
    assert code == 0, err
    (document,) = list(yaml.safe_load_all(stdout))
    assert document["env"]["num_envs"] == 4 and document["seed"] == 3
    assert document["optimizations"]["batch_inference"] is True


# --------------------------------------------------------------------------- bad input: exit 2, one line, nothing written

def _bad_yaml(tmp: Path) -> str:
    path = tmp / "broken.yaml"
    path.write_text("env: {id: CartPole-v1\n  num_envs: [\n", encoding="utf-8")
    return str(path)


BAD_INPUTS: dict[str, Any] = {
    "unknown preset": (lambda tmp: ["run", "ppo-cartpol"], "did you mean 'ppo-cartpole'"),
    "unknown --set key": (lambda tmp: ["run", "ppo-cartpole", "--set", "optimizations.warp_drive=true"],
                          "optimizations.warp_drive"),
    "unknown --set section": (lambda tmp: ["run", "ppo-cartpole", "--set", "nope.x=1"], "nope"),
    "bad --set value": (lambda tmp: ["run", "ppo-cartpole", "--set", "env.num_envs=abc"], "env.num_envs"),
    "out-of-range --set value": (lambda tmp: ["run", "ppo-cartpole", "--set", "env.num_envs=0"], "env.num_envs"),
    "bad bool-or-auto value": (lambda tmp: ["run", "ppo-cartpole", "--set", "optimizations.amp=maybe"],
                               "optimizations.amp"),
    "--set without =": (lambda tmp: ["run", "ppo-cartpole", "--set", "foo"], "KEY=VALUE"),
    "flag the device cannot honour": (lambda tmp: ["run", "ppo-cartpole", "--set", "device=cpu",
                                                   "--set", "optimizations.pinned_memory=true"], "pinned_memory"),
    "--device cuda without CUDA": (lambda tmp: ["run", "ppo-cartpole", "--device", "cuda"], "cuda"),
    "--steps abc": (lambda tmp: ["run", "ppo-cartpole", "--steps", "abc"], "--steps"),
    "--steps 0": (lambda tmp: ["run", "ppo-cartpole", "--steps", "0"], "run.steps"),
    "--variant unknown": (lambda tmp: ["run", "ppo-cartpole", "--variant", "fast"], "--variant"),
    "missing config file": (lambda tmp: ["run", str(tmp / "nowhere.yaml")], "not found"),
    "malformed YAML file": (lambda tmp: ["run", _bad_yaml(tmp)], "malformed YAML"),
    "unknown subcommand": (lambda tmp: ["frobnicate"], "frobnicate"),
    "missing argument": (lambda tmp: ["run"], "required"),
    "no subcommand": (lambda tmp: [], "required"),
    "--out is a directory": (lambda tmp: ["run", "ppo-cartpole", "--out", str(tmp / "outdir")], "directory"),
    "config: unknown preset": (lambda tmp: ["config", "ppo-cartpol"], "did you mean 'ppo-cartpole'"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(case: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    if case == "--device cuda without CUDA" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    build, needle = BAD_INPUTS[case]
    (tmp_path / "outdir").mkdir()
    argv = build(tmp_path)
    out = tmp_path / "r.json"
    out.write_text("previous result\n", encoding="utf-8")
    if argv and argv[0] == "run" and "--out" not in argv:
        argv = [*argv, "--out", str(out)]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    code, stdout, err = run_cli(capsys, *argv)

    assert code == 2
    assert err.startswith("rlgauge: error: ")
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    assert needle in err
    assert stdout == ""
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert out.read_text(encoding="utf-8") == "previous result\n"


def test_a_bad_flag_in_the_second_variant_fails_before_the_first_is_built(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    original = ppo_module.PPOTrainer.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append("trainer")
        original(self, *args, **kwargs)

    monkeypatch.setattr(ppo_module.PPOTrainer, "__init__", spy)
    preset = tmp_path / "two.yaml"
    preset.write_text(yaml.safe_dump({
        "description": "baseline fine, optimized asks for pinned memory on the CPU",
        "config": {"env": {"id": "CartPole-v1"}},
        "variants": {"baseline": {}, "optimized": {"optimizations": {"pinned_memory": True}}},
    }), encoding="utf-8")
    out = tmp_path / "r.json"
    code, stdout, err = run_cli(capsys, "run", str(preset), *TINY_ARGS, "--out", str(out))
    assert code == 2
    assert err.startswith("rlgauge: error: optimizations.pinned_memory") and len(err.splitlines()) == 1
    assert "Optimisations:" not in err and stdout == ""
    assert built == [] and not out.exists()



def test_out_below_a_regular_file_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("keep me\n", encoding="utf-8")
    code, _, err = run_cli(capsys, "run", "ppo-cartpole", "--variant", "optimized", *TINY_ARGS,
                           "--out", str(blocker / "r.json"), "--quiet")
    assert code == 2
    assert err.startswith("rlgauge: error: ") and len(err.splitlines()) == 1
    assert blocker.read_text(encoding="utf-8") == "keep me\n"


# --------------------------------------------------------------------------- unstable / failed: exit 1

def _nan_loss(monkeypatch: pytest.MonkeyPatch, poisoned: Any = lambda: True) -> None:
    original = ppo_module.ppo_loss

    def nan_loss(*args: Any, **kwargs: Any) -> Any:
        loss, stats = original(*args, **kwargs)
        return (loss * float("nan"), stats) if poisoned() else (loss, stats)

    monkeypatch.setattr(ppo_module, "ppo_loss", nan_loss)
    original_grads = ppo_updates.ppo_loss_grads

    def nan_loss_grads(*args: Any, **kwargs: Any) -> Any:  # the analytic_grads path's loss
        loss, stats, grad_logits, grad_values = original_grads(*args, **kwargs)
        nan = float("nan") if poisoned() else 1.0
        return loss * nan, stats, grad_logits * nan, grad_values * nan

    monkeypatch.setattr(ppo_updates, "ppo_loss_grads", nan_loss_grads)
    original_host = numpy_update.ppo_loss_grads

    def nan_host_loss_grads(*args: Any, **kwargs: Any) -> Any:  # the numpy_update path's loss
        scalars, grad_logits, grad_values = original_host(*args, **kwargs)
        nan = np.float32("nan") if poisoned() else np.float32(1.0)
        return scalars * nan, grad_logits * nan, grad_values * nan

    monkeypatch.setattr(numpy_update, "ppo_loss_grads", nan_host_loss_grads)


ROUND_TWO = 9
"""The first iteration of the second timed round of a TINY run of ppo-cartpole: one warm-up iteration a
variant, then three a variant for a round's 64 env steps (32 decisions an iteration, less the reset steps)."""


def _count_iterations(monkeypatch: pytest.MonkeyPatch, on_call: Any = None) -> dict[str, int]:
    calls = {"n": 0}
    original = ppo_module.PPOTrainer.iterate

    def iterate(self: Any) -> Any:
        calls["n"] += 1
        if on_call is not None:
            on_call(calls["n"])
        return original(self)

    monkeypatch.setattr(ppo_module.PPOTrainer, "iterate", iterate)
    return calls


def test_nan_loss_under_skip_update_policy_is_unstable_and_exits_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _nan_loss(monkeypatch)
    out = tmp_path / "r.json"
    code, _, err = run_cli(capsys, "run", "ppo-cartpole", "--variant", "optimized", *TINY_ARGS,
                           "--set", "stability.nan_policy=skip_update", "--out", str(out), "--quiet")
    assert code == 1
    (run,) = read_json(out)["runs"]
    assert run["status"] == "unstable"
    assert run["stability"]["nonfinite_events"] > 0 and run["stability"]["passed"] is False
    assert run["metrics"]["env_steps_per_sec"]["median"] > 0  # measured to the end: skipped updates only
    assert "optimized run is unstable" in err and "Traceback" not in err



def test_nan_loss_under_warn_policy_ends_in_a_written_result_and_exit_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _nan_loss(monkeypatch)
    out = tmp_path / "r.json"
    code, _, err = run_cli(capsys, "run", "ppo-cartpole", "--variant", "optimized", *TINY_ARGS,
                           "--set", "stability.nan_policy=warn", "--out", str(out), "--quiet")
    assert code == 1
    (run,) = read_json(out)["runs"]
    assert run["status"] in ("unstable", "failed")
    assert run["stability"]["nonfinite_events"] > 0 and run["stability"]["passed"] is False
    assert "Traceback" not in err


def test_nan_loss_under_raise_policy_after_measuring_fails_and_exits_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN from the second round on: both variants have one measured repeat, then fail in the second."""
    calls = _count_iterations(monkeypatch)
    _nan_loss(monkeypatch, poisoned=lambda: calls["n"] >= ROUND_TWO)
    out = tmp_path / "r.json"
    code, _, err = run_cli(capsys, "run", "ppo-cartpole", *TINY_ARGS, "--repeats", "2",
                           "--set", "stability.nan_policy=raise", "--out", str(out), "--quiet")
    assert code == 1
    runs = read_json(out)["runs"]
    assert [r["status"] for r in runs] == ["failed", "failed"]
    for run in runs:
        assert "non-finite" in run["error"]
        assert run["stability"]["passed"] is False and run["stability"]["nonfinite_events"] > 0
        assert len(run["metrics"]["env_steps_per_sec"]["samples"]) == 1  # the repeat measured before the NaN
    assert "baseline run is failed" in err and "optimized run is failed" in err



def test_nan_loss_from_the_start_fails_exits_1_and_still_writes_the_result(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _nan_loss(monkeypatch)
    out = tmp_path / "r.json"
    code, _, err = run_cli(capsys, "run", "ppo-cartpole", *TINY_ARGS, "--set", "stability.nan_policy=raise",
                           "--out", str(out), "--quiet")
    assert code == 1
    runs = read_json(out)["runs"]
    assert [r["status"] for r in runs] == ["failed", "failed"]
    assert all(r["metrics"]["env_steps_per_sec"] is None for r in runs)
    assert "Traceback" not in err


# --------------------------------------------------------------------------- interrupted: exit 130

def _interrupt_at(n: int) -> Any:
    def on_call(call: int) -> None:
        if call >= n:
            raise KeyboardInterrupt

    return on_call


def test_interrupt_after_measuring_exits_130_and_writes_an_interrupted_result(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in the 2nd round (its first iteration): the partial result is kept, marked."""
    _count_iterations(monkeypatch, on_call=_interrupt_at(ROUND_TWO))
    out = tmp_path / "r.json"
    code, _, err = run_cli(capsys, "run", "ppo-cartpole", *TINY_ARGS, "--repeats", "2", "--out", str(out), "--quiet")
    assert code == 130
    runs = read_json(out)["runs"]
    assert [r["status"] for r in runs] == ["interrupted", "interrupted"]
    assert all(r["stability"]["passed"] is False for r in runs)
    assert all(len(r["metrics"]["env_steps_per_sec"]["samples"]) == 1 for r in runs)
    assert "Traceback" not in err



def test_interrupt_early_exits_130_and_writes_an_interrupted_result(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _count_iterations(monkeypatch, on_call=_interrupt_at(3))  # after both warm-ups, in the first timed repeat
    out = tmp_path / "r.json"
    code, _, err = run_cli(capsys, "run", "ppo-cartpole", *TINY_ARGS, "--out", str(out), "--quiet")
    assert code == 130
    assert out.exists()
    runs = read_json(out)["runs"]
    assert [r["status"] for r in runs] == ["interrupted", "interrupted"]
    assert "Traceback" not in err


def test_keyboard_interrupt_in_any_command_exits_130_with_one_line(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.cli as cli

    def interrupted(args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "presets", interrupted)
    code, _, err = run_cli(capsys, "presets")
    assert code == 130
    assert err.strip() == "rlgauge: interrupted"


# --------------------------------------------------------------------------- real subprocess

def _python_m_harness(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "harness", *argv], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=env, timeout=timeout)


def test_python_m_harness_bad_input_exits_2_without_traceback() -> None:
    proc = _python_m_harness("run", "ppo-cartpol")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("rlgauge: error: unknown preset 'ppo-cartpol'")
    assert len(proc.stderr.splitlines()) == 1
    assert proc.stdout == ""


def test_python_m_harness_runs_a_quiet_optimized_variant(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = _python_m_harness("run", "ppo-cartpole", "--variant", "optimized", *TINY_ARGS, "--quiet",
                             "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Optimisations:" not in proc.stderr
    assert "env_steps_per_sec" in proc.stdout
    (run,) = read_json(out)["runs"]
    assert run["variant"] == "optimized" and run["status"] == "ok"


def test_importing_the_cli_loads_no_torch() -> None:
    """``record``, ``compare``, ``presets`` and ``gate`` on files answer fast: torch loads only to train."""
    import subprocess
    import sys

    code = "import sys, harness.cli; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
