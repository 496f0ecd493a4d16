"""NVML readings of a CUDA run: sampled only during the timed segments, recorded as
``gpu_utilization_pct`` / ``gpu_peak_memory_mb``, shown in the run table and RUNS.md; nothing on
CPU runs; nulls and one note without pynvml. A fake NVML module stands in for the driver."""

from __future__ import annotations

import importlib.util
import logging
import sys
import time
import types
from typing import Any

import pytest
import torch
from rich.console import Console

from conftest import TINY
from harness.measurement import gpu_monitor
from harness.measurement import runner
from harness.errors import UserError
from harness.measurement.gpu_monitor import GpuMonitor, gpu_metrics, open_monitor
from harness.specs.presets import specs_for
from harness.report.tables import results_table
from harness.results import RunResult
from harness.report.runs_md import format_rows
from results_factory import make_result

MB = 2**20


class FakeNVML(types.ModuleType):
    """pynvml's calls rlgauge makes, with fixed readings: utilisation 40 then 80 % (repeating),
    memory in use 100 then 300 MB (repeating)."""

    class NVMLError(Exception):
        pass

    def __init__(self, fail_init: bool = False) -> None:
        super().__init__("pynvml")
        self.fail_init = fail_init
        self.inits = self.shutdowns = self.readings = 0
        self.handles: list[Any] = []

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        self.inits += 1
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:  # noqa: N802
        raise self.NVMLError(f"Not Found: {uuid}")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
        self.handles.append(index)
        return ("handle", index)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:  # noqa: N802
        self.readings += 1
        return types.SimpleNamespace(gpu=40 if self.readings % 2 else 80, memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:  # noqa: N802
        return types.SimpleNamespace(used=(100 if self.readings % 2 else 300) * MB, total=1000 * MB)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNVML:
    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(gpu_monitor, "_noted", set())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: types.SimpleNamespace(uuid="0000-fake", name="Fake GPU"))
    return fake


def test_the_sampler_averages_utilisation_and_keeps_peak_memory_while_started(nvml: FakeNVML) -> None:
    monitor = GpuMonitor(nvml, ("handle", 0), interval_s=0.005)
    monitor.start()
    time.sleep(0.05)
    monitor.stop()
    taken = len(monitor.utilization)
    assert taken >= 2 and set(monitor.utilization) == {40.0, 80.0}
    assert monitor.peak_memory_mb == pytest.approx(300.0)
    time.sleep(0.03)  # stopped: no reading between segments
    assert len(monitor.utilization) == taken
    monitor.close()
    assert nvml.shutdowns == 1


def test_a_segment_shorter_than_the_interval_still_gets_a_reading(nvml: FakeNVML) -> None:
    monitor = GpuMonitor(nvml, ("handle", 0), interval_s=60.0)
    monitor.start()
    monitor.stop()
    assert monitor.utilization == [40.0] and monitor.peak_memory_mb == pytest.approx(100.0)
    assert gpu_metrics(monitor) == {"gpu_utilization_pct": 40.0, "gpu_peak_memory_mb": pytest.approx(100.0)}


def test_a_monitor_without_readings_and_no_monitor_record_nulls(nvml: FakeNVML) -> None:
    assert gpu_metrics(None) == {"gpu_utilization_pct": None, "gpu_peak_memory_mb": None}
    assert gpu_metrics(GpuMonitor(nvml, None)) == {"gpu_utilization_pct": None, "gpu_peak_memory_mb": None}


def test_cpu_runs_never_load_nvml(nvml: FakeNVML) -> None:
    assert open_monitor(torch.device("cpu")) is None
    assert nvml.inits == 0


def test_a_cuda_device_gets_nvmls_handle_by_uuid_or_else_its_index(nvml: FakeNVML) -> None:
    monitor = open_monitor(torch.device("cuda", 1))
    assert isinstance(monitor, GpuMonitor) and monitor.handle == ("handle", 1) and nvml.inits == 1
    assert open_monitor(torch.device("cuda")).handle == ("handle", 0)  # cuda: the current device


def test_without_pynvml_a_cuda_run_records_nulls_and_says_once_how_to_get_them(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    monkeypatch.setattr(gpu_monitor, "_noted", set())
    with caplog.at_level(logging.WARNING, logger="rlgauge"):
        assert open_monitor(torch.device("cuda")) is None
        assert open_monitor(torch.device("cuda")) is None
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and "rlgauge[cuda]" in notes[0] and "\n" not in notes[0]


def test_an_nvml_that_cannot_start_records_nulls_with_a_note(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(fail_init=True))
    monkeypatch.setattr(gpu_monitor, "_noted", set())
    with caplog.at_level(logging.WARNING, logger="rlgauge"):
        assert open_monitor(torch.device("cuda")) is None
    assert "NVML failed (Driver Not Loaded)" in caplog.text


def test_the_runner_samples_during_timed_segments_and_records_the_readings(
        nvml: FakeNVML, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU run given a (fake) monitor, as a CUDA run gets one: started and stopped around each timed
    repeat only, closed at the end, its readings in the result."""
    events: list[str] = []

    class Recording(GpuMonitor):
        def start(self) -> None:
            events.append("start")
            super().start()

        def stop(self) -> None:
            if self._thread is not None:
                events.append("stop")
            super().stop()

    monkeypatch.setattr(runner, "open_monitor", lambda device: Recording(nvml, ("handle", 0), interval_s=60.0))
    (spec,) = specs_for("ppo-cartpole", "baseline", [*TINY, "run.repeats=3"])
    (result,), _ = runner.run_variants([spec], say=lambda _text: None)
    assert result.status == "ok"
    assert events == ["start", "stop"] * 3
    assert nvml.readings == 3 and nvml.shutdowns == 1  # one reading per (short) segment, none in warm-up
    assert result.metrics["gpu_utilization_pct"] == pytest.approx((40 + 80 + 40) / 3)
    assert result.metrics["gpu_peak_memory_mb"] == pytest.approx(300.0)
    assert result.metrics["device_utilization_pct"] > 0  # on the CPU: still the process's CPU share


def test_a_cpu_run_records_null_gpu_metrics_without_touching_nvml(nvml: FakeNVML) -> None:
    (spec,) = specs_for("ppo-cartpole", "baseline", TINY)
    (result,), _ = runner.run_variants([spec], say=lambda _text: None)
    assert result.metrics["gpu_utilization_pct"] is None and result.metrics["gpu_peak_memory_mb"] is None
    assert nvml.inits == 0 and nvml.readings == 0


def _gpu_run(util: float | None, memory: float | None) -> RunResult:
    run = make_result("optimized", device="cuda")
    run.machine["device_name"] = "Fake GPU"
    run.metrics.update(gpu_utilization_pct=util, gpu_peak_memory_mb=memory)
    return run


def test_the_readings_are_shown_in_the_run_table_only_where_recorded() -> None:
    def text(results: list[RunResult]) -> str:
        console = Console(width=200, record=True)
        console.print(results_table(results))
        return console.export_text()

    shown = text([make_result("baseline"), _gpu_run(87.0, 2345.0)])
    line = next(line for line in shown.splitlines() if "gpu_utilization_pct" in line)
    assert "87" in line
    assert "2,345" in next(line for line in shown.splitlines() if "gpu_peak_memory_mb" in line)
    assert "gpu_utilization_pct" not in text([make_result("baseline"), make_result("optimized")])


def test_runs_md_puts_the_readings_in_the_device_cell_and_keeps_the_columns() -> None:
    (row,) = format_rows("m", [[_gpu_run(87.0, 2345.0)]])
    assert "| cuda (Fake GPU; NVML: 87 % busy, 2,345 MB in use at peak) |" in row
    (plain,) = format_rows("m", [[_gpu_run(None, None)]])
    assert "| cuda (Fake GPU) |" in plain
    assert row.count("|") == plain.count("|")


def test_result_files_with_readings_load_and_impossible_readings_are_refused() -> None:
    data = _gpu_run(87.0, 2345.0).to_dict()
    assert RunResult.from_dict(data).metrics["gpu_utilization_pct"] == 87.0
    for key, bad in (("gpu_utilization_pct", 150.0), ("gpu_peak_memory_mb", -1.0), ("gpu_utilization_pct", "high")):
        with pytest.raises(UserError, match=f"metrics.{key}"):
            RunResult.from_dict({**data, "metrics": {**data["metrics"], key: bad}})


@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("pynvml") is None,
                    reason="needs CUDA and nvidia-ml-py")
def test_a_real_cuda_run_records_nvml_readings() -> None:
    (spec,) = specs_for("ppo-cartpole", "optimized", [*[s for s in TINY if s != "device=cpu"], "device=cuda"])
    (result,), _ = runner.run_variants([spec], say=lambda _text: None)
    assert result.status == "ok", result.error
    assert 0 <= result.metrics["gpu_utilization_pct"] <= 100
    assert result.metrics["gpu_peak_memory_mb"] > 0
    assert result.metrics["device_utilization_pct"] == result.metrics["gpu_utilization_pct"]
