"""Result files (``harness.results``) and the numbers that go into them (``harness.measurement.metrics``)."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from harness import results as results_module
from harness.errors import UserError
from harness.measurement.metrics import TimingProbe, latency_percentiles, spread
from harness.results import SCHEMA_VERSION, STATUSES, RunResult, check_writable, load_results, save_results
from reference_trainers.runtime.probe import PHASES


def make_run(variant: str = "baseline", status: str = "ok", rate: float = 1000.0) -> RunResult:
    return RunResult(
        preset="ppo-cartpole", variant=variant, algo="ppo", status=status,
        started_at="2025-01-02T03:04:05+00:00", git={"commit": "abc123", "dirty": False},
        machine={"cpu": "test cpu", "cores": 2, "torch": "2.13.0", "device": "cpu", "device_name": "x86_64"},
        config={"device": "cpu", "env": {"id": "CartPole-v1", "num_envs": 2}, "optimizations": {"amp": False}},
        metrics={
            "env_steps_per_sec": spread([rate, rate * 1.1, rate * 0.9]),
            "agent_steps_per_sec": spread([rate, rate * 1.1, rate * 0.9]),
            "updates_per_sec": spread([10.0, 11.0, 9.0]),
            "inference_latency_ms": {"p50": 0.25, "p95": 0.5},
            "phase_seconds": {phase: 0.1 for phase in PHASES},
            "peak_host_rss_mb": 300.5, "peak_device_mem_mb": None, "device_utilization_pct": 99.0,
            "host_syncs_per_step": 1.0625, "warmup_s": 0.05, "mean_return_last_k": None,
        },
        stability={"float64_ops": 0, "nonfinite_events": 0, "compile_fallback": False, "passed": True},
        resolution={"optimizations.amp": "False (reason)"}, steps_completed=192, error=None,
    )


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def valid_payload() -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "runs": [make_run().to_dict(), make_run("optimized").to_dict()]}


# --------------------------------------------------------------------------- save / load

def test_save_then_load_round_trips_every_field(tmp_path: Path) -> None:
    runs = [make_run("baseline"), make_run("optimized", status="unstable", rate=2500.0)]
    runs[1].error = "something"
    path = tmp_path / "r.json"
    save_results(path, runs)
    assert load_results(path) == runs


def test_saved_file_is_the_documented_json_shape(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    save_results(path, [make_run()])
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["schema_version"] == 1 == SCHEMA_VERSION
    assert isinstance(data["runs"], list) and len(data["runs"]) == 1
    assert data["runs"][0]["metrics"]["env_steps_per_sec"]["samples"] == [1000.0, 1100.0, 900.0]


def test_save_leaves_no_temporary_files(tmp_path: Path) -> None:
    save_results(tmp_path / "r.json", [make_run()])
    save_results(tmp_path / "r.json", [make_run("optimized")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_save_replaces_an_existing_file_instead_of_appending(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("x" * 100_000, encoding="utf-8")  # longer than the result: a truncating write would leave a tail
    save_results(path, [make_run("baseline"), make_run("optimized")])
    save_results(path, [make_run("optimized")])
    data = json.loads(path.read_text(encoding="utf-8"))
    assert [r["variant"] for r in data["runs"]] == ["optimized"]


def test_failed_save_keeps_the_previous_file_and_leaves_no_temporary(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "r.json"
    save_results(path, [make_run("baseline")])
    previous = path.read_bytes()

    def crash(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(results_module.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        save_results(path, [make_run("optimized")])
    assert path.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_a_process_killed_mid_write_leaves_the_previous_file_whole(tmp_path: Path) -> None:
    """SIGKILL while the new result is half written (before its rename): the old file still loads."""
    path, started = tmp_path / "r.json", tmp_path / "started"
    save_results(path, [make_run("baseline")])
    previous = path.read_bytes()
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from harness import results
        from test_results import make_run
        def stall(fd):
            open({str(started)!r}, "w").close()
            time.sleep(60)
        results.os.fsync = stall
        results.save_results(results.Path({str(path)!r}), [make_run("optimized")] * 200)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1])
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the writer never reached fsync"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert path.read_bytes() == previous
    assert [r.variant for r in load_results(path)] == ["baseline"]


def test_an_old_schema_1_file_without_later_fields_still_loads(tmp_path: Path) -> None:
    """Files written before ``resolution``, ``steps_completed`` and ``error`` existed load with their defaults."""
    payload = valid_payload()
    for run in payload["runs"]:
        for key in ("resolution", "steps_completed", "error"):
            del run[key]
    (first, _) = load_results(write_json(tmp_path / "old.json", payload))
    assert (first.resolution, first.steps_completed, first.error) == ({}, 0, None)


def test_a_file_from_before_machine_state_quality_and_cpu_seconds_still_loads(tmp_path: Path) -> None:
    payload = valid_payload()
    for run in payload["runs"]:
        del run["machine_state"], run["quality"]
        run["metrics"].pop("cpu_seconds_per_1k_env_steps", None)
    (first, _) = load_results(write_json(tmp_path / "old.json", payload))
    assert (first.machine_state, first.quality) == ({}, None)
    assert "cpu_seconds_per_1k_env_steps" not in first.metrics


def test_machine_state_quality_and_cpu_seconds_round_trip(tmp_path: Path) -> None:
    run = make_run()
    run.metrics["cpu_seconds_per_1k_env_steps"] = spread([0.5, 0.6, 0.55])
    run.machine_state = {"usable_cores": 2, "load_avg_before": [0.1, 0.2, 0.3], "threads": {"intra_op": 1}}
    run.quality = {"trustworthy": False, "reasons": ["other processes took 62 % of the CPU"]}
    save_results(tmp_path / "r.json", [run])
    assert load_results(tmp_path / "r.json") == [run]


def _median_outside_range(payload: dict[str, Any]) -> dict[str, Any]:
    payload["runs"][1]["metrics"]["env_steps_per_sec"]["median"] = 5000.0  # max is 1100
    return payload


def _cpu_median_outside_range(payload: dict[str, Any]) -> dict[str, Any]:
    payload["runs"][0]["metrics"]["cpu_seconds_per_1k_env_steps"] = {"median": 0.1, "min": 0.5, "max": 0.6,
                                                                     "samples": [0.5, 0.6]}
    return payload


def _quality_as_text(payload: dict[str, Any]) -> dict[str, Any]:
    payload["runs"][0]["quality"] = {"trustworthy": "yes", "reasons": []}
    return payload


def _machine_state_as_list(payload: dict[str, Any]) -> dict[str, Any]:
    payload["runs"][0]["machine_state"] = [1, 2]
    return payload


def test_save_creates_missing_parent_folders(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "r.json"
    save_results(path, [make_run()])
    assert load_results(path) == [make_run()]


def test_load_accepts_unknown_extra_fields_from_newer_writers(tmp_path: Path) -> None:
    payload = valid_payload()
    payload["runs"][0]["something_new"] = {"x": 1}
    assert [r.variant for r in load_results(write_json(tmp_path / "r.json", payload))] == ["baseline", "optimized"]


def _missing_keys(payload: dict[str, Any]) -> dict[str, Any]:
    del payload["runs"][1]["metrics"]
    del payload["runs"][1]["stability"]
    return payload


def _unknown_status(payload: dict[str, Any]) -> dict[str, Any]:
    payload["runs"][0]["status"] = "great"
    return payload


BAD_FILES: dict[str, tuple[Any, str]] = {
    # name: (how to make the file: None = absent, str = raw text, callable = edit a valid payload), text in message
    "missing file": (None, "not found"),
    "invalid JSON": ('{"schema_version": 1, "runs": [', "not valid JSON"),
    "empty file": ("", "not valid JSON"),
    "a JSON list": ("[1, 2, 3]", "not an rlgauge result file"),
    "no schema_version": (lambda p: {"runs": p["runs"]}, "schema_version"),
    "no runs": (lambda p: {"schema_version": 1}, "runs"),
    "wrong schema_version": (lambda p: {**p, "schema_version": 2}, "schema_version 2"),
    "runs not a list": (lambda p: {**p, "runs": {"a": 1}}, "list"),
    "run not an object": (lambda p: {**p, "runs": ["baseline"]}, "run 0"),
    "run missing keys": (_missing_keys, "run 1: run is missing metrics, stability"),
    "unknown status": (_unknown_status, "'great'"),
    "rate median outside its range": (_median_outside_range, "run 1: metrics.env_steps_per_sec: median 5000 lies "
                                      "outside its own [min, max] = [900, 1100]"),
    "CPU median outside its range": (_cpu_median_outside_range, "metrics.cpu_seconds_per_1k_env_steps: median 0.1"),
    "quality not a verdict": (_quality_as_text, "run 0: quality.trustworthy"),
    "machine_state not an object": (_machine_state_as_list, "run 0: machine_state"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_load_rejects_a_bad_file_with_one_line_naming_it(case: str, tmp_path: Path) -> None:
    make, needle = BAD_FILES[case]
    path = tmp_path / "result.json"
    if isinstance(make, str):
        path.write_text(make, encoding="utf-8")
    elif make is not None:
        write_json(path, make(copy.deepcopy(valid_payload())))
    with pytest.raises(UserError) as caught:
        load_results(path)
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message
    assert needle in message
    assert caught.value.__cause__ is None  # no chained "direct cause" traceback


def test_every_status_of_the_design_loads(tmp_path: Path) -> None:
    assert STATUSES == ("ok", "unstable", "failed", "interrupted")
    runs = [make_run(status=status) for status in STATUSES]
    save_results(tmp_path / "r.json", runs)
    assert [r.status for r in load_results(tmp_path / "r.json")] == list(STATUSES)


# --------------------------------------------------------------------------- check_writable

def test_check_writable_accepts_a_new_file_in_an_existing_or_missing_folder(tmp_path: Path) -> None:
    check_writable(tmp_path / "r.json")
    check_writable(tmp_path / "not" / "yet" / "r.json")
    (tmp_path / "old.json").write_text("{}", encoding="utf-8")
    check_writable(tmp_path / "old.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]  # checking writes nothing


def test_check_writable_rejects_a_directory(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is a directory") as caught:
        check_writable(tmp_path)
    assert "\n" not in str(caught.value)


def test_check_writable_rejects_an_unwritable_directory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running with privileges that ignore directory permissions (root)")
        with pytest.raises(UserError, match="not writable"):
            check_writable(locked / "r.json")
        with pytest.raises(UserError, match="not writable"):
            check_writable(locked / "sub" / "r.json")
    finally:
        locked.chmod(0o700)



def test_check_writable_rejects_a_path_below_a_regular_file(tmp_path: Path) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("x", encoding="utf-8")
    with pytest.raises(UserError):
        check_writable(blocker / "r.json")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_check_writable_rejects_a_folder_where_files_cannot_be_created() -> None:
    with pytest.raises(UserError):
        check_writable(Path("/proc/rlgauge-result.json"))


# --------------------------------------------------------------------------- metrics

def test_spread_gives_median_min_max_and_the_samples() -> None:
    block = spread([3.0, 1.0, 2.0, 10.0])
    assert block == {"median": 2.5, "min": 1.0, "max": 10.0, "samples": [3.0, 1.0, 2.0, 10.0]}
    assert spread([5])["median"] == 5.0 and isinstance(spread([5])["samples"][0], float)
    json.dumps(spread([1, 2, 3]))  # plain JSON types


def test_latency_percentiles_are_in_milliseconds() -> None:
    seconds = [0.001 * (i + 1) for i in range(100)]  # 1 ms .. 100 ms
    latency = latency_percentiles(seconds)
    assert set(latency) == {"p50", "p95"}
    assert latency["p50"] == pytest.approx(50.5, rel=1e-4)
    assert latency["p95"] == pytest.approx(95.05, rel=1e-4)
    assert all(type(v) is float for v in latency.values())
    assert latency_percentiles([0.002] * 5) == pytest.approx({"p50": 2.0, "p95": 2.0}, rel=1e-5)


def test_timing_probe_records_only_while_enabled() -> None:
    probe = TimingProbe()
    assert probe.enabled is False
    with probe.phase("env"):
        time.sleep(0.01)
    assert probe.totals()["env"] == 0.0
    probe.enabled = True
    with probe.phase("env"):
        time.sleep(0.01)
    with probe.phase("update"):
        pass
    probe.enabled = False
    with probe.phase("env"):
        time.sleep(0.01)
    totals = probe.totals()
    assert 0.009 <= totals["env"] < 0.5
    assert 0.0 <= totals["update"] < 0.01
    assert totals["inference"] == 0.0


def test_timing_probe_totals_has_every_phase() -> None:
    probe = TimingProbe()
    assert set(probe.totals()) == set(PHASES) == {"env", "inference", "update", "transfer", "logging"}
    assert all(type(v) is float for v in probe.totals().values())


def test_timing_probe_counts_time_of_a_phase_that_raises() -> None:
    probe = TimingProbe()
    probe.enabled = True
    with pytest.raises(ValueError), probe.phase("transfer"):
        time.sleep(0.005)
        raise ValueError("boom")
    assert probe.totals()["transfer"] >= 0.004


def test_rlgauge_commit_names_the_commit_of_a_copied_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout copied to another machine (no .git, or another one) records the commit it was told."""
    from harness.measurement.provenance import git_info

    monkeypatch.delenv("RLGAUGE_COMMIT", raising=False)
    assert git_info(tmp_path) == {"commit": None, "dirty": False}
    assert len(str(git_info()["commit"])) == 40  # this checkout's own
    monkeypatch.setenv("RLGAUGE_COMMIT", "0123456789abcdef")
    assert git_info(tmp_path) == {"commit": "0123456789abcdef", "dirty": False}
    assert git_info() == {"commit": "0123456789abcdef", "dirty": False}
