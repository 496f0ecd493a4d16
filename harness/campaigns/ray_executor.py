"""``--executor ray[:ADDRESS]``: each job a Ray task on one machine with whole cores (the ``ray`` extra).

Without an address Ray starts here on this machine's cores (or joins the cluster that ``RAY_ADDRESS``
names, as ``ray.init`` does); with one it joins that cluster after checking, within
``CONNECT_TIMEOUT_S``, that something answers there. A task holds ``cpus_per_job`` whole CPUs, and
torch's threads inside it are capped to them. Ctrl-C cancels the tasks still running and keeps
the results of those that finished.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from harness.campaigns.jobs import Gathered, Job, run_with_host
from harness.errors import UserError

CONNECT_TIMEOUT_S = 10.0
"""How long ``ray:ADDRESS`` waits for the head to answer before exit 2."""
DEFAULT_PORT = 6379
"""A Ray head's GCS port (``ray start --head``); ``ray://`` client addresses default to 10001."""
CLIENT_PORT = 10001
INSTALL = "pip install 'rlgauge[ray]'"


def _require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError(f"--executor ray: Ray is not installed; install the extra: {INSTALL}") from None
    return ray


def head_endpoint(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``host[:port]`` or ``ray://host[:port]``; ``UserError`` for a malformed address."""
    client = address.startswith("ray://")
    rest = address[len("ray://"):] if client else address
    host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not host or (port and not port.isdigit()):
        raise UserError(f"--executor ray:{address}: not an address; accepted: ray:HOST:PORT or ray:ray://HOST:PORT")
    return host, int(port) if port else (CLIENT_PORT if client else DEFAULT_PORT)


def check_reachable(address: str, timeout_s: float | None = None) -> None:
    """``UserError`` unless a TCP connection to the head opens within ``timeout_s`` (``CONNECT_TIMEOUT_S``)."""
    timeout_s = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    host, port = head_endpoint(address)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise UserError(f"--executor ray:{address}: no Ray head answered at {host}:{port} within {timeout_s:g} s "
                        f"({exc.strerror or type(exc).__name__}); accepted: the address 'ray start --head' printed"
                        ) from None


def _remote_body(fn: Callable[..., Any], cpus: int, *args: Any) -> tuple[Any, str]:
    """Inside the task: torch's default threads capped to the task's CPUs, then the job."""
    from reference_trainers.runtime import device as dev

    dev.cap_default_threads(cpus)
    return run_with_host(fn, *args)


class RayExecutor:
    """Jobs as Ray tasks; results gathered as they finish."""

    name = "ray"

    def __init__(self, address: str | None, fresh_processes: bool = False) -> None:
        self.ray = _require_ray()
        self.address = address
        self.fresh_processes = fresh_processes
        if address is not None and address != "auto" and not self.ray.is_initialized():
            check_reachable(address)  # a malformed or silent address fails before anything runs

    @property
    def label(self) -> str:
        return f"ray:{self.address}" if self.address else "ray (local)"

    def _start(self) -> bool:
        """Join or start Ray; True when this call started it (and so shuts it down)."""
        ray = self.ray
        if ray.is_initialized():
            return False
        runtime_env = None
        if self.address is None and not os.environ.get("RAY_ADDRESS"):
            # a local Ray's workers import the user's trainer module from where the command runs
            path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
            runtime_env = {"env_vars": {"PYTHONPATH": path}}
        try:
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                     logging_level="WARNING", runtime_env=runtime_env)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UserError(f"--executor {self.label}: Ray could not start or connect: "
                            f"{' '.join(str(exc).split())[:200]}") from None
        return True

    def run(self, jobs: list[Job], *, cpus_per_job: int = 1,
            on_result: Callable[[Job, Any], None] | None = None) -> Gathered:
        ray = self.ray
        started = self._start()
        gathered = Gathered()
        # fresh processes: a worker runs one task and exits, so no task inherits another's process state
        options = {"max_calls": 1} if self.fresh_processes else {}
        task = ray.remote(num_cpus=cpus_per_job, max_retries=0, **options)(_remote_body)
        pending = {task.remote(job.fn, cpus_per_job, *job.args): job for job in jobs}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    job = pending.pop(ref)
                    result, host = self._get(ref)
                    gathered.results[job.name], gathered.hosts[job.name] = result, host
                    if on_result is not None:
                        on_result(job, result)
        except KeyboardInterrupt:
            gathered.interrupted = True
            for ref in pending:
                ray.cancel(ref, force=True)
        finally:
            if started:
                ray.shutdown()
        return gathered

    def _get(self, ref: Any) -> Any:
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as exc:  # the job's own exception, as a local run raises it
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            raise
