"""``run.heap_retention``: glibc's malloc thresholds fixed high while the harness measures.

A CPU update allocates and frees the same large arrays every minibatch (NumPy's and torch's
activations and gradients, hundreds of KB each). glibc hands a block above its mmap threshold
fresh pages from the kernel and unmaps them on free, and it gives back the top of its heap once
more than its trim threshold lies free there; either way the next minibatch faults every page
in again. Both thresholds adapt to what the process freed before, so the same trainer can pay
hundreds of page faults a minibatch in one process and none in another, depending on its
history (import order included). Fixed high with ``mallopt``, freed blocks stay in the heap
and every arm of a run reuses pages already mapped, whatever ran before it.

glibc has no call that gives the thresholds back to their adaptive rule, so this is one-way:
the process keeps them fixed once they are set.
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
MMAP_THRESHOLD = 32 * 1024 * 1024
"""Blocks below this come from the heap (glibc's largest accepted value on 64-bit)."""
TRIM_THRESHOLD = 512 * 1024 * 1024
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


class HeapRetention:
    """The process's malloc thresholds: glibc's adaptive ones until ``retain`` fixes them high."""

    def __init__(self) -> None:
        self.retained = False

    def retain(self) -> bool:
        """Fix both thresholds high (once; later calls do nothing). False where the C library is not
        glibc, or glibc refused the values: the thresholds stay glibc's own."""
        if not self.retained:
            mallopt = glibc_mallopt()
            self.retained = bool(mallopt and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                                 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        return self.retained


heap_retention = HeapRetention()
"""The process's one state (process-wide, like torch's thread count)."""
