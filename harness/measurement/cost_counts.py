"""Deterministic cost counts of training: no timer, so no noise.

Per env step of a trainer's iterations, counted while they run:

- ``aten_ops``: ops torch dispatches to a backend (views included: each is a Python-to-C++
  dispatch); a kernel added per step shows here;
- ``host_syncs``: the one host-sync counter of ``run`` and ``diagnose``
  (``harness.diagnosis.host_syncs``); an ``.item()`` added per step shows here;
- ``float64_ops``: the float64 sentinel's count (``harness.measurement.sentinels``);
- ``output_bytes``: bytes of the tensors the dispatched ops return (what the allocator is asked
  for, views aside): memory traffic that follows the code, not the allocator's caching;
- ``python_calls``: Python function calls in this thread (``sys.setprofile``): the count that follows
  the CPU work NumPy and Python do, where no torch op runs;
- ``instructions``: hardware instructions retired in this thread (``perf_event_open``), where the
  kernel exposes the counter (a VM often does not: then None). Not exact between processes
  (interrupts, page faults): reported, never gated at a factor near 1.

A run with the same seed, code and library versions gives the same counts, on any machine load.
Compiled code is run eagerly while counted (``torch.compiler.set_stance("force_eager")``): what a
compiled path dispatches depends on the compile cache and the backend's choices, so its counts are
those of its eager code, the same in every process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import sys
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.diagnosis.frames import SiteFinder
from harness.diagnosis.host_syncs import HostSyncFinder
from harness.measurement.sentinels import Float64Sentinel

COUNTS: tuple[str, ...] = ("aten_ops", "host_syncs", "float64_ops", "output_bytes", "python_calls", "instructions")
"""Every count, per env step; ``instructions`` is None where the kernel has no counter for it."""


class OpCounter(TorchDispatchMode):
    """Dispatched ops and the bytes of the tensors they return."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.output_bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and not tensor._is_view():
                self.output_bytes += tensor.numel() * tensor.element_size()
        return out


@contextlib.contextmanager
def python_calls(into: list[int]) -> Iterator[None]:
    """Python function calls in this thread meanwhile, added to ``into[0]``."""
    previous = sys.getprofile()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            into[0] += 1

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(previous)


_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
_PERF_TYPE_HARDWARE, _PERF_COUNT_HW_INSTRUCTIONS = 0, 1
_DISABLED, _EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 0, 1 << 5, 1 << 6
_IOC_ENABLE, _IOC_DISABLE = 0x2400, 0x2401


def open_instruction_counter() -> int | None:
    """A perf counter of user-space instructions retired by this thread (a file descriptor), or None where
    the kernel or the machine has none (no PMU in the VM, ``perf_event_paranoid`` too high, not Linux)."""
    number = _PERF_EVENT_OPEN.get(os.uname().machine) if hasattr(os, "uname") else None
    if number is None or not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    attr = bytearray(128)
    struct.pack_into("IIQ", attr, 0, _PERF_TYPE_HARDWARE, len(attr), _PERF_COUNT_HW_INSTRUCTIONS)
    struct.pack_into("Q", attr, 40, _DISABLED | _EXCLUDE_KERNEL | _EXCLUDE_HV)
    fd = libc.syscall(number, ctypes.create_string_buffer(bytes(attr)), 0, -1, -1, 0)
    return fd if fd >= 0 else None


@contextlib.contextmanager
def instructions(into: list[int | None]) -> Iterator[None]:
    """User-space instructions this thread retires meanwhile into ``into[0]`` (None without a counter)."""
    fd = open_instruction_counter()
    if fd is None:
        into[0] = None
        yield
        return
    import fcntl

    try:
        fcntl.ioctl(fd, _IOC_ENABLE, 0)
        try:
            yield
        finally:
            fcntl.ioctl(fd, _IOC_DISABLE, 0)
        into[0] = struct.unpack("Q", os.read(fd, 8))[0]
    finally:
        os.close(fd)


def count_costs(run: Callable[[], int], device: torch.device) -> dict[str, float | None]:
    """Run ``run`` (it trains and returns the env steps it took) under every counter; each count per env step."""
    ops, wide = OpCounter(), Float64Sentinel()
    syncs = HostSyncFinder(device, SiteFinder())
    calls: list[int] = [0]
    retired: list[int | None] = [0]
    with torch.compiler.set_stance("force_eager"), syncs, wide, ops, instructions(retired), python_calls(calls):
        env_steps = run()
    steps = max(1, env_steps)
    return {"aten_ops": ops.ops / steps, "host_syncs": syncs.count / steps, "float64_ops": wide.count / steps,
            "output_bytes": ops.output_bytes / steps, "python_calls": calls[0] / steps,
            "instructions": None if retired[0] is None else retired[0] / steps}
