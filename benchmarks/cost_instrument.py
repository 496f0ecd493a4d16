"""The counting instrument of ``CostCounts``: deterministic cost counts of a piece of work, no timer.

It lives in the suite, beside the yardstick, and imports nothing of the project: asv runs the working
tree's suite against both commits of a comparison, so both are counted by the very same instrument (a
refactor of the project's own diagnosis code cannot move a count). Per unit of work (an env step of
training, an action selection of acting):

- ``aten_ops``: ops torch dispatches to a backend (views included: each is a Python-to-C++
  dispatch); a kernel added per step shows here;
- ``host_syncs``: calls that make the host wait for a value: ``.item()``, ``float(t)``/``int(t)``,
  ``.numpy()``/``.tolist()``, ``bool(t)``, data-dependent shapes (``nonzero``, boolean masks), and
  ``.cpu()``/``.to("cpu")`` of an accelerator's tensor. On the CPU nothing waits, so the calls are
  counted as they would be on an accelerator;
- ``float64_ops``: dispatched ops with a float64/complex128 tensor among their inputs or outputs;
- ``output_bytes``: bytes of the new tensors the dispatched ops return: an output that shares an
  input's storage (an in-place op, ``out=``, a view) allocates nothing and is not counted;
- ``python_calls``: Python function calls in this thread (``sys.setprofile``) over a second stretch of
  the same work with no counting mode active, so that none of the instrument's own frames (nor torch's
  mode dispatch) is among them: the count that follows the CPU work NumPy and Python do, where no torch
  op runs;
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
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

COUNTS: tuple[str, ...] = ("aten_ops", "host_syncs", "float64_ops", "output_bytes", "python_calls", "instructions")
"""Every count, per unit of work; ``instructions`` is None where the kernel has no counter for it."""

_T = torch.Tensor
_SYNCS = {_T.item, _T.__float__, _T.__int__, _T.__index__, _T.numpy, _T.tolist, _T.__bool__, _T.nonzero,
          torch.nonzero, torch.masked_select, _T.masked_select, torch.argwhere}
_WIDE = (torch.float64, torch.complex128)


class SyncCounter(TorchFunctionMode):
    """Host synchronisations: every tensor method the work calls is seen here (torch's own calls inside a
    counted one are not the work's)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.on_cpu = device.type == "cpu"
        self.count = 0
        self._inside = 0

    def _is_sync(self, func: Any, args: tuple, kwargs: dict) -> bool:
        tensor = args[0] if args else None
        if not isinstance(tensor, torch.Tensor) or not (self.on_cpu or tensor.device.type != "cpu"):
            return False
        if func in _SYNCS:
            return True
        if func is _T.__getitem__ and len(args) > 1:
            parts = args[1] if isinstance(args[1], tuple) else (args[1],)
            return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)
        if self.on_cpu:
            return False
        if func is _T.cpu:
            return True
        target = kwargs.get("device", args[1] if func is _T.to and len(args) > 1 else None)
        return func is _T.to and isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu"

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self._inside == 0 and self._is_sync(func, args, kwargs):
            self.count += 1
        self._inside += 1
        try:
            return func(*args, **kwargs)
        finally:
            self._inside -= 1


class OpCounter(TorchDispatchMode):
    """Dispatched ops, the float64 ones among them, and the bytes of the new tensors they return."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.float64_ops = 0
        self.output_bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        inputs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        outputs = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
        if any(x.dtype in _WIDE for x in inputs + outputs):
            self.float64_ops += 1
        shared = {x.untyped_storage().data_ptr() for x in inputs if x.numel()}
        for tensor in outputs:
            if tensor.numel() and tensor.untyped_storage().data_ptr() not in shared:
                self.output_bytes += tensor.numel() * tensor.element_size()
        return out


@contextlib.contextmanager
def python_calls(into: list[int]) -> Iterator[None]:
    """Python function calls in this thread meanwhile, added to ``into[0]`` (the profile function's own calls
    are not profiled)."""
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


def count_costs(run: Callable[[], float], device: torch.device) -> dict[str, float | None]:
    """Run ``run`` (it does its work and returns how much: env steps, selections) twice: under the op, sync
    and instruction counters, then under the Python-call counter alone; each count per unit of that work."""
    import torch._dynamo  # noqa: F401  (torch.optim imports it on a first step: not while counted)

    ops, syncs = OpCounter(), SyncCounter(device)
    calls: list[int] = [0]
    retired: list[int | None] = [0]
    with torch.compiler.set_stance("force_eager"), syncs, ops, instructions(retired):
        units = max(1.0, float(run()))
    with torch.compiler.set_stance("force_eager"), python_calls(calls):
        call_units = max(1.0, float(run()))
    return {"aten_ops": ops.ops / units, "host_syncs": syncs.count / units, "float64_ops": ops.float64_ops / units,
            "output_bytes": ops.output_bytes / units, "python_calls": calls[0] / call_units,
            "instructions": None if retired[0] is None else retired[0] / units}
