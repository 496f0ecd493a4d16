"""Memory of a short training run: host peak RSS (``peakmem_``) and, where the device has
memory of its own, the peak the allocator reports (``track_``)."""

from __future__ import annotations

from reference_trainers.runtime import device as dev

from .common import PARAM_NAMES, PARAMS, build, skip_unless_available

ITERATIONS = 2
"""Rollout + update iterations of the short run: buffers are allocated up front, so the peak
is reached in the first one; the second catches growth across iterations."""


def train_briefly(preset: str, variant: str, device: str) -> float | None:
    """Build, train ``ITERATIONS`` iterations; the device's peak allocated MiB (None on CPU)."""
    saved = dev.process_settings()
    trainer = build(preset, variant, device)
    try:
        dev.reset_peak_memory(trainer.device)
        for _ in range(ITERATIONS):
            trainer.iterate()
        dev.synchronize(trainer.device)
        return dev.peak_device_memory_mb(trainer.device)
    finally:
        trainer.close()
        dev.restore_process_settings(saved)


class HostMemory:
    params = PARAMS
    param_names = PARAM_NAMES
    timeout = 300

    def setup(self, preset: str, variant: str, device: str) -> None:
        skip_unless_available(device)

    def peakmem_short_training(self, preset: str, variant: str, device: str) -> None:
        train_briefly(preset, variant, device)


class DeviceMemory:
    params = PARAMS
    param_names = PARAM_NAMES
    timeout = 300

    def setup(self, preset: str, variant: str, device: str) -> None:
        skip_unless_available(device)
        if device == "cpu":
            raise NotImplementedError("the CPU has no device memory of its own (see HostMemory)")

    def track_peak_device_mem_mb(self, preset: str, variant: str, device: str) -> float:
        peak = train_briefly(preset, variant, device)
        if peak is None:
            raise RuntimeError(f"{device}: the device reported no peak memory")
        return peak

    track_peak_device_mem_mb.unit = "MiB"  # type: ignore[attr-defined]
