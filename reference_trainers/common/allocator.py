"""``optimizations.heap_retention``: glibc's allocator keeps freed large blocks for the next step.

A CPU update allocates and frees the same large arrays every minibatch (NumPy's and torch's
activations and gradients, hundreds of KB each). glibc hands a block above its mmap threshold
fresh pages from the kernel and unmaps them on free, and it gives back the top of its heap once
more than its trim threshold lies free there. Either way the next minibatch faults every page
in again, and a page fault costs more than the arithmetic done on the page. Both thresholds
adapt to what the process freed before, so whether a process pays depends on its history
(import order included). Set with ``mallopt``, they stay fixed and high: freed blocks stay in
the heap and the next step reuses pages already mapped. The same arithmetic on the same values
(the exact parity class); only where memory comes from changes. Guarded by
tests/test_allocator.py.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
from collections.abc import Callable

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""``mallopt`` parameter numbers (glibc's malloc.h)."""
GLIBC_DEFAULT_THRESHOLD = 128 * 1024
"""glibc's documented default of both thresholds, restored when retention is switched off."""
RETAINED_MMAP_THRESHOLD = 32 * 1024 * 1024
"""Blocks below this come from the heap (glibc's largest accepted value on 64-bit)."""
RETAINED_TRIM_THRESHOLD = 512 * 1024 * 1024
"""Free memory the heap keeps at its top before giving it back to the kernel."""


@functools.lru_cache(maxsize=1)
def glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None where the C library is not glibc (macOS, musl, Windows)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is not None:
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def unavailable_reason() -> str | None:
    """Why heap retention cannot run in this process (None where it can)."""
    if glibc_mallopt() is None:
        return f"it sets glibc's malloc thresholds, and this process's C library is not glibc ({platform.system()})"
    return None


class HeapRetention:
    """glibc's mmap and trim thresholds, raised while a heap-retaining trainer runs (``apply``)."""

    def __init__(self) -> None:
        self.retaining = False

    def apply(self, retain: bool) -> None:
        """Raise both thresholds if ``retain``, else put back glibc's defaults if this process raised
        them (a process that never retained is left untouched); O(1) when unchanged."""
        if retain == self.retaining:
            return
        mallopt = glibc_mallopt()
        if mallopt is None:
            raise RuntimeError(f"optimizations.heap_retention: {unavailable_reason()}")
        mmap, trim = ((RETAINED_MMAP_THRESHOLD, RETAINED_TRIM_THRESHOLD) if retain
                      else (GLIBC_DEFAULT_THRESHOLD, GLIBC_DEFAULT_THRESHOLD))
        if not (mallopt(M_MMAP_THRESHOLD, mmap) and mallopt(M_TRIM_THRESHOLD, trim)):
            raise RuntimeError("optimizations.heap_retention: glibc's mallopt refused the thresholds")
        self.retaining = retain


heap_retention = HeapRetention()
"""The process's one switch (process-wide state, like torch's thread count)."""
