"""GPU utilisation and memory from NVML, sampled on a background thread during a CUDA run's timed segments.

``pynvml`` comes from ``nvidia-ml-py`` (``pip install 'rlgauge[cuda]'``). Utilisation is NVML's
``gpu`` rate: the percent of its last sample period in which a kernel ran on the device, averaged
over every sample of every timed segment. Memory is the device's memory in use (every process,
the CUDA context included), its peak over the samples: beside ``peak_device_mem_mb``, which is
torch's allocator alone. CPU and MPS runs never load NVML; a CUDA run without ``pynvml`` records
nulls and says once, on stderr, how to get them.
"""

from __future__ import annotations

import logging
import threading
from types import ModuleType
from typing import Any

log = logging.getLogger("rlgauge")

INTERVAL_S = 0.1
"""Seconds between samples (NVML refreshes its utilisation every 1/6 s to 1 s, depending on the GPU)."""
MISSING_NOTE = ("note: GPU utilisation and memory are not recorded: pynvml is not installed "
                "(pip install 'rlgauge[cuda]' installs nvidia-ml-py)")
_noted: set[str] = set()


def _note_once(text: str) -> None:
    """One stderr line per distinct note and process (several variants share the reason)."""
    if text not in _noted:
        _noted.add(text)
        log.warning(text)


class GpuMonitor:
    """Samples one GPU between ``start()`` and ``stop()`` (any number of times); ``close()`` ends NVML."""

    def __init__(self, nvml: ModuleType, handle: Any, interval_s: float = INTERVAL_S) -> None:
        self.nvml, self.handle, self.interval_s = nvml, handle, interval_s
        self.utilization: list[float] = []
        self.peak_memory_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """One reading of utilisation and memory in use."""
        self.utilization.append(float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))
        self.peak_memory_bytes = max(self.peak_memory_bytes, int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> None:
        """Sample every ``interval_s`` on a daemon thread until ``stop()``."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="rlgauge-gpu-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the sampling thread and take one last reading (a segment shorter than the interval counts too)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.sample()

    def close(self) -> None:
        self.stop()
        self.nvml.nvmlShutdown()

    @property
    def mean_utilization_pct(self) -> float | None:
        return sum(self.utilization) / len(self.utilization) if self.utilization else None

    @property
    def peak_memory_mb(self) -> float | None:
        return self.peak_memory_bytes / 2**20 if self.utilization else None


def _import_nvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def _handle(nvml: ModuleType, index: int) -> Any:
    """NVML's handle of torch's CUDA device ``index``, found by UUID (NVML counts every GPU, torch only the
    visible ones), by index where the UUID is not known."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except nvml.NVMLError:  # not found under that UUID: fall back to the index
            pass
    return nvml.nvmlDeviceGetHandleByIndex(index)


def open_monitor(device: Any) -> GpuMonitor | None:
    """A monitor of ``device`` (a ``torch.device``) on CUDA; None elsewhere, or without pynvml (noted once)."""
    if device.type != "cuda":
        return None
    nvml = _import_nvml()
    if nvml is None:
        _note_once(MISSING_NOTE)
        return None
    try:
        nvml.nvmlInit()
        import torch

        return GpuMonitor(nvml, _handle(nvml, device.index if device.index is not None else torch.cuda.current_device()))
    except nvml.NVMLError as exc:  # NVML present but unusable (no driver access in a container, ...)
        _note_once(f"note: GPU utilisation and memory are not recorded: NVML failed ({exc})")
        return None


def gpu_metrics(monitor: GpuMonitor | None) -> dict[str, float | None]:
    """``gpu_utilization_pct`` and ``gpu_peak_memory_mb`` of a run (nulls without a monitor or samples)."""
    if monitor is None:
        return {"gpu_utilization_pct": None, "gpu_peak_memory_mb": None}
    return {"gpu_utilization_pct": monitor.mean_utilization_pct, "gpu_peak_memory_mb": monitor.peak_memory_mb}
