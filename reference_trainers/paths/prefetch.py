"""``optimizations.num_workers``: assemble the next minibatches on background threads.

``Prefetcher.map(fn, items)`` yields ``fn(item)`` in order. With 0 workers (plain) each is
computed inline when asked for; with k workers up to k results beyond the one being
consumed are computed ahead on a thread pool (a bounded lookahead), so the host-side gather of
minibatch i+1..i+k overlaps the update of minibatch i (torch ops release the GIL).
``close()`` cancels what is queued and joins the threads. Items and the order of random
draws are decided by the caller on its own thread, so the data are identical for any k
(guarded by tests/test_prefetch.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

THREAD_PREFIX = "rlgauge-prefetch"


class Prefetcher:
    """Ordered, bounded-lookahead ``map`` over ``num_workers`` threads (0 = inline)."""

    def __init__(self, num_workers: int) -> None:
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.num_workers = num_workers
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix=THREAD_PREFIX) if num_workers else None

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """``fn(item)`` for each item, in order, computed up to ``num_workers`` items ahead."""
        if self._pool is None:
            for item in items:
                yield fn(item)
            return
        pending: deque[Future[R]] = deque()
        source = iter(items)
        try:
            for item in source:
                pending.append(self._pool.submit(fn, item))
                if len(pending) > self.num_workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:  # a consumer that stops early leaves nothing running
                future.cancel()
            for future in pending:
                if not future.cancelled():
                    future.exception()

    def close(self) -> None:
        """Cancel queued work and join the worker threads (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
