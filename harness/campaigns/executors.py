"""Executors: where a campaign's jobs run. ``local`` (the default) runs them here, in order; ``ray[:ADDRESS]``
sends each as a Ray task (``ray_executor``). Every executor keeps what finished when interrupted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from harness.campaigns.fresh_process import JobInterrupted, run_in_fresh_process
from harness.campaigns.jobs import Gathered, Job, host_name
from harness.errors import UserError

EXECUTORS = "local | ray | ray:ADDRESS"
"""What ``--executor`` accepts (ADDRESS: a Ray head's host:port or ray://host:port)."""


class Executor(Protocol):
    name: str

    def run(self, jobs: list[Job], *, cpus_per_job: int, on_result: Callable[[Job, Any], None] | None = None
            ) -> Gathered:
        """Run every job (each on one machine with ``cpus_per_job`` whole cores); interrupted: what finished."""
        ...


class LocalExecutor:
    """Jobs one after another on this machine: in this process, or each in a fresh process of its own
    (``fresh_processes``: nothing one job leaves in the process reaches the next, see ``fresh_process``).
    Ctrl-C stops the campaign and keeps the finished jobs (and, from a fresh process, what the job it
    was in had filled)."""

    name = "local"

    def __init__(self, fresh_processes: bool = False) -> None:
        self.fresh_processes = fresh_processes

    def run(self, jobs: list[Job], *, cpus_per_job: int = 1,
            on_result: Callable[[Job, Any], None] | None = None) -> Gathered:
        gathered = Gathered()
        try:
            for job in jobs:
                if self.fresh_processes:
                    try:
                        result, host = run_in_fresh_process(job)
                    except JobInterrupted as stopped:
                        if stopped.partial is not None:
                            gathered.results[job.name], gathered.hosts[job.name] = stopped.partial, host_name()
                        raise KeyboardInterrupt from None
                else:
                    result, host = job.fn(*job.args), host_name()
                gathered.results[job.name], gathered.hosts[job.name] = result, host
                if on_result is not None:
                    on_result(job, result)
        except KeyboardInterrupt:
            gathered.interrupted = True
        return gathered


def parse_executor(text: str | None, fresh_processes: bool = False) -> Executor:
    """``--executor``: ``local`` (default), ``ray`` (a local Ray, or the cluster ``RAY_ADDRESS`` names) or
    ``ray:ADDRESS``; ``UserError`` for anything else, or when Ray is not installed. ``fresh_processes``:
    every job in a process no other job ran in, on either executor."""
    value = (text or "local").strip()
    if value == "local":
        return LocalExecutor(fresh_processes)
    kind, _, address = value.partition(":")
    if kind != "ray" or (value.startswith("ray:") and not address):
        raise UserError(f"--executor {text}: unknown executor; accepted: {EXECUTORS}")
    from harness.campaigns.ray_executor import RayExecutor

    return RayExecutor(address or None, fresh_processes)
