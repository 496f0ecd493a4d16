"""Ctrl-C and SIGTERM during a measurement: stop once, cleanly, and keep what was measured.

Inside ``stop_on_signals()`` the first SIGINT or SIGTERM raises ``KeyboardInterrupt`` where
the program is (the runner turns it into ``interrupted`` results, closes the trainers and
their env workers); any further signal, or any after ``hold()``, is noted and ignored until
the block ends, so closing the workers and writing the result cannot be cut short. The
previous handlers are restored on the way out, so blocks nest: ``main()`` wraps every
command (a SIGTERM ends any of them like Ctrl-C, exit code 130), a measurement wraps itself.
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

    def hold(self) -> None:
        """From now on (closing, writing the result) signals are noted on stderr, not raised."""
        self.holding = True

    def handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        if self.holding:
            print(f"rlgauge: {name} ignored: stopping, the result is being written", file=sys.stderr)
            return
        self.holding = True
        raise KeyboardInterrupt(name)


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
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
