"""A job in a process of its own: a spawned child that starts from nothing a job before it changed.

Native libraries keep state across a process's life that no Python call resets: once torch's intra-op
threads have been set above one, a later single-threaded training run takes other float paths than in a
process where they never were (docs/analysis.md). A campaign whose jobs must not depend on the order
they ran in (``learn``: each seed's curves) runs each in a fresh process, on the local executor as on Ray.

The job travels with ``cloudpickle`` (a peer's build function may be a closure). The child has a process
group of its own, so the terminal's Ctrl-C reaches the parent alone, which forwards it once: the child
stops where its job checks for a stop, and sends back the argument its job fills as it goes
(``Job.keeps``), so an interrupted campaign keeps the job it was in.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from harness.campaigns.jobs import Job, host_name

INTERRUPTED_WAIT_S = 60.0
"""How long an interrupted parent waits for its child to send what it had, before ending it."""


class JobInterrupted(Exception):
    """The job was stopped by a signal; ``partial`` is what it had filled (``Job.keeps``), or None."""

    def __init__(self, partial: Any) -> None:
        super().__init__("interrupted")
        self.partial = partial


def run_in_fresh_process(job: Job) -> tuple[Any, str]:
    """``job.fn(*job.args)`` in a spawned child: (its result, the host). Raises the job's own exception,
    or ``JobInterrupted`` (with the partial result) when a signal stopped it."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child_main, name=f"rlgauge {job.name}", daemon=True,
                            args=(sender, cloudpickle.dumps(job), logging.getLogger("rlgauge").level))
    child.start()
    sender.close()
    try:
        try:
            message = _receive(receiver, child, None)
        except KeyboardInterrupt:
            if child.is_alive() and child.pid is not None:
                os.kill(child.pid, signal.SIGINT)
            message = _receive(receiver, child, INTERRUPTED_WAIT_S)
            if message[0] != "interrupted":  # it finished before the signal: still a stopped campaign
                message = ("interrupted", message[1][0] if message[0] == "done" else None)
    finally:
        child.join(timeout=5)
        if child.is_alive():
            child.kill()
            child.join()
        receiver.close()
    kind, payload = message
    if kind == "done":
        return payload
    if kind == "interrupted":
        raise JobInterrupted(payload)
    raise payload


def _receive(receiver: Connection, child: Any, timeout_s: float | None) -> tuple[str, Any]:
    """The child's one message; a child that died without one is an error naming its exit code."""
    if receiver.poll(timeout_s):
        try:
            return receiver.recv()
        except EOFError:
            pass
    child.join(timeout=5)
    if timeout_s is not None and child.exitcode is None:
        return ("interrupted", None)
    return ("error", RuntimeError(f"the job's process ended without a result (exit code {child.exitcode})"))


def _child_main(sender: Connection, payload: bytes, log_level: int) -> None:
    from harness.measurement.interrupts import stop_on_signals

    os.setpgrp()  # the terminal's Ctrl-C goes to the parent, which forwards it once
    logging.basicConfig(level=logging.WARNING, format="rlgauge: %(message)s")
    logging.getLogger("rlgauge").setLevel(log_level)
    job: Job = cloudpickle.loads(payload)
    with stop_on_signals() as signals:
        try:
            message: tuple[str, Any] = ("done", (job.fn(*job.args), host_name()))
        except KeyboardInterrupt:
            message = ("interrupted", None if job.keeps is None else job.args[job.keeps])
        except BaseException as exc:  # noqa: BLE001 - sent to the parent, which raises it
            message = ("error", exc)
        signals.hold()
        try:
            sender.send(message)
        except Exception as exc:  # noqa: BLE001 - an exception or result that does not pickle
            sender.send(("error", RuntimeError(f"{type(exc).__name__}: {exc} (sending {message[0]} back)")))
        sender.close()
