"""Ctrl-C and SIGTERM during a measurement: stop once, cleanly, and keep what was measured.

Inside ``stop_on_signals()`` the first SIGINT or SIGTERM raises ``KeyboardInterrupt`` where
the program is (the runner turns it into ``interrupted`` results, closes the trainers and
their env workers); any further signal, or any after ``hold()``, is noted and ignored until
the block ends, so closing the workers and writing the result cannot be cut short. The
previous handlers are restored on the way out, so blocks nest: ``main()`` wraps every
command (a SIGTERM ends any of them like Ctrl-C, exit code 130), a measurement wraps itself.

A ``KeyboardInterrupt`` raised where Python cannot pass it on (a finaliser, a callback that
swallows errors) would be lost, and the run would go on with the signal spent:
``raise_if_stopping()``, called by the measuring loops before each iteration, raises it again.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SignalStop:
    """The state of ``stop_on_signals()``: the first signal interrupts, unless ``hold()`` was called."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.holding = False
        self.stopping = False  # the first signal came before ``hold()``: the run must stop

    def hold(self) -> None:
        """From now on (closing, writing the result) signals are noted on stderr, not raised."""
        self.holding = True

    def handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        if self.holding or self.stopping:
            print(f"rlgauge: {name} ignored: stopping, the result is being written", file=sys.stderr)
            return
        self.stopping = True
        raise KeyboardInterrupt(name)

    def raise_if_stopping(self) -> None:
        """Raise the first signal's ``KeyboardInterrupt`` again, unless ``hold()`` came since."""
        if self.stopping and not self.holding:
            raise KeyboardInterrupt(self.received[0])


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
    _ACTIVE.append(stop)
    try:
        yield stop
    finally:
        _ACTIVE.remove(stop)
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
