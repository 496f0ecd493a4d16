"""Ctrl-C and SIGTERM during a measurement: stop once, cleanly, and keep what was measured.

Inside ``stop_on_signals()`` the first SIGINT or SIGTERM raises ``KeyboardInterrupt`` where
the program is (the runner turns it into ``interrupted`` results, closes the trainers and
their env workers); any further signal, or any after ``hold()``, is noted and ignored until
the block ends, so closing the workers and writing the result cannot be cut short. The
previous handlers are restored on the way out, so blocks nest: ``main()`` wraps every
command (a SIGTERM ends any of them like Ctrl-C, exit code 130), a measurement wraps itself.

Inside a measuring loop (``deferred_interrupts()``) the first signal does not raise where the
program happens to be: an exception raised asynchronously in the middle of a library call can leave a
lock held or a worker pipe half read, and the run then hangs while it closes. The loop stops at its
next ``raise_if_stopping()``, between two iterations; an iteration that has not reached that check
within ``ESCALATE_AFTER_S`` (a long ``iterate()`` of your own trainer) is interrupted where it is, as
outside a loop. A ``KeyboardInterrupt`` that got lost (swallowed by a finaliser) is raised again there too.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
ESCALATE_AFTER_S = 3.0
"""How long a deferred signal waits for the loop's next check before it interrupts the iteration itself."""


class SignalStop:
    """The state of ``stop_on_signals()``: the first signal interrupts, unless ``hold()`` was called."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.holding = False
        self.stopping = False  # the first signal came before ``hold()``: the run must stop
        self.deferring = 0  # inside a measuring loop: stop at its next check (``deferred_interrupts``)
        self.handled: tuple[int, ...] = ()  # the signals whose handler this is
        self._escalating = False
        self._timer: threading.Timer | None = None

    def hold(self) -> None:
        """From now on (closing, writing the result) signals are noted on stderr, not raised."""
        self.holding = True

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self._escalating:  # our own timer: the iteration did not reach its check in time
            self._escalating = False
            if self.stopping and not self.holding:
                raise KeyboardInterrupt(self.received[0])
            return
        name = signal.Signals(signum).name
        self.received.append(name)
        if self.holding or self.stopping:
            print(f"rlgauge: {name} ignored: stopping, the result is being written", file=sys.stderr)
            return
        self.stopping = True
        if self.deferring:
            self._escalate_later()
            return
        raise KeyboardInterrupt(name)

    def raise_if_stopping(self) -> None:
        """Raise the first signal's ``KeyboardInterrupt`` (again), unless ``hold()`` came since."""
        if self.stopping and not self.holding:
            self.cancel_escalation()
            raise KeyboardInterrupt(self.received[0])

    def _escalate_later(self) -> None:
        self._timer = threading.Timer(ESCALATE_AFTER_S, self._escalate)
        self._timer.daemon = True
        self._timer.start()

    def _escalate(self) -> None:
        if self.stopping and not self.holding and self.deferring and self.handled:
            self._escalating = True
            _thread.interrupt_main(self.handled[0])  # runs ``handle`` in the main thread, which raises

    def cancel_escalation(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


_ACTIVE: list[SignalStop] = []  # the blocks now active, innermost last


def raise_if_stopping() -> None:
    """In a measuring loop: stop here if a signal came whose ``KeyboardInterrupt`` got lost."""
    if _ACTIVE:
        _ACTIVE[-1].raise_if_stopping()


@contextmanager
def stop_on_signals() -> Iterator[SignalStop]:
    """While active: the first SIGINT/SIGTERM raises ``KeyboardInterrupt``; later ones are ignored."""
    stop = SignalStop()
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set from the main thread
        yield stop
        return
    # a signal ignored on purpose (SIGINT of a background job started with nohup or `&`) stays ignored
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}
    for sig in previous:
        signal.signal(sig, stop.handle)
    stop.handled = tuple(previous)
    _ACTIVE.append(stop)
    try:
        yield stop
    finally:
        stop.cancel_escalation()
        _ACTIVE.remove(stop)
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Around a measuring loop that calls ``raise_if_stopping()`` before each iteration: a signal stops it
    there (or, after ``ESCALATE_AFTER_S``, where it is); leaving the loop normally with a signal pending
    raises it at once."""
    stop = _ACTIVE[-1] if _ACTIVE else None
    if stop is None:
        yield
        return
    stop.deferring += 1
    try:
        yield
    finally:
        stop.deferring -= 1
        if not stop.deferring:
            stop.cancel_escalation()
    stop.raise_if_stopping()
