"""Executors: where a campaign's jobs run. ``local`` (the default) runs them here, in order; ``ray[:ADDRESS]``
sends each as a Ray task (``ray_executor``). Every executor keeps what finished when interrupted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

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
    """Jobs one after another in this process; Ctrl-C stops the campaign and keeps the finished jobs."""

    name = "local"

    def run(self, jobs: list[Job], *, cpus_per_job: int = 1,
            on_result: Callable[[Job, Any], None] | None = None) -> Gathered:
        gathered = Gathered()
        try:
            for job in jobs:
                result = job.fn(*job.args)
                gathered.results[job.name], gathered.hosts[job.name] = result, host_name()
                if on_result is not None:
                    on_result(job, result)
        except KeyboardInterrupt:
            gathered.interrupted = True
        return gathered


def parse_executor(text: str | None) -> Executor:
    """``--executor``: ``local`` (default), ``ray`` (a local Ray, or the cluster ``RAY_ADDRESS`` names) or
    ``ray:ADDRESS``; ``UserError`` for anything else, or when Ray is not installed."""
    value = (text or "local").strip()
    if value == "local":
        return LocalExecutor()
    kind, _, address = value.partition(":")
    if kind != "ray" or (value.startswith("ray:") and not address):
        raise UserError(f"--executor {text}: unknown executor; accepted: {EXECUTORS}")
    from harness.campaigns.ray_executor import RayExecutor

    return RayExecutor(address or None)
