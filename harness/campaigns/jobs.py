"""One job of a campaign: a module-level function and its arguments, and what came of running it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Job:
    """``fn(*args)`` under a short name (``seed 3``, ``ppo-cartpole``); ``fn`` must be importable by name
    (a Ray worker imports it), its arguments picklable."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    keeps: int | None = None
    """The index of the argument the job fills as it goes (kept when a fresh-process job is interrupted)."""


@dataclass
class Gathered:
    """What the executor gathered: each finished job's result by name (in the jobs' order), and whether the
    campaign was interrupted before every job finished."""

    results: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False
    hosts: dict[str, str] = field(default_factory=dict)
    """The machine each job ran on (its host name)."""

    def in_order(self, jobs: list[Job]) -> list[Any]:
        """The finished jobs' results in the order the jobs were given."""
        return [self.results[job.name] for job in jobs if job.name in self.results]


def host_name() -> str:
    """This machine's name, recorded beside each job's result."""
    import socket

    return socket.gethostname()


def run_with_host(fn: Callable[..., Any], *args: Any) -> tuple[Any, str]:
    """``fn(*args)`` and the name of the machine it ran on (the body of a remote task)."""
    return fn(*args), host_name()
