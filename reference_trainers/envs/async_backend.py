"""gymnasium's AsyncVectorEnv with worker failures as one-line errors and a close that leaves no process behind.

A sub-env that raises, or a worker process that dies (killed, crashed), becomes an
``EnvWorkerError`` naming the env id, the sub-env index and what happened; the other
workers are stopped at once (the vector env is unusable after a lost sub-env). ``close()``
asks the workers to finish, and terminates (then kills) any that do not. Workers ignore
SIGINT: Ctrl-C reaches the whole process group, and the main process, which owns the
workers, closes them on its way out.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import time
from functools import partial
from typing import Any, Callable, Sequence

import gymnasium as gym
from gymnasium.vector import AutoresetMode
from gymnasium.vector.async_vector_env import AsyncState

STOP_TIMEOUT_S = 5.0
"""Seconds a worker gets to finish after close() or terminate before it is killed."""


class EnvWorkerError(RuntimeError):
    """A sub-env of an async vector env failed; ``str(err)`` is one line naming the env id and sub-env."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _ignoring_sigint(make_env: Callable[[], gym.Env], main_pid: int) -> gym.Env:
    """Build the env; in a worker process (not ``main_pid``, where gymnasium builds one to read the
    spaces) first leave Ctrl-C to the main process, and let SIGTERM (``terminate()`` on close)
    end the worker quietly rather than run a handler inherited from the main process."""
    if os.getpid() != main_pid:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return make_env()


def _exit_reason(process: multiprocessing.process.BaseProcess) -> str:
    code = process.exitcode
    if code is None:
        return "its pipe closed unexpectedly"
    if code < 0:
        try:
            return f"its worker process (pid {process.pid}) was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"its worker process (pid {process.pid}) was killed by signal {-code}"
    return f"its worker process (pid {process.pid}) exited with code {code}"


class CheckedAsyncVectorEnv(gym.vector.AsyncVectorEnv):
    """``AsyncVectorEnv`` (shared memory, NEXT_STEP autoreset) that reports worker failures clearly."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], env_id: str) -> None:
        self.env_id = env_id
        super().__init__([partial(_ignoring_sigint, fn, os.getpid()) for fn in env_fns], shared_memory=True,
                         autoreset_mode=AutoresetMode.NEXT_STEP)

    # ----------------------------------------------------------------- failures -> EnvWorkerError
    def _raise_if_errors(self, successes: Sequence[bool]) -> None:
        """Collect every sub-env's error (without gymnasium's traceback logging), stop all workers, raise one line.

        Replaces the hook gymnasium 1.x calls after every reset/step/call; test_env_faults.py guards it."""
        failed = len(successes) - sum(bool(s) for s in successes)
        if not failed:
            return
        errors = []
        with contextlib.suppress(queue.Empty):
            for _ in range(failed):
                errors.append(self.error_queue.get(timeout=STOP_TIMEOUT_S))
        self._stop_workers()
        if not errors:
            raise EnvWorkerError(f"env {self.env_id!r}: {failed} sub-env(s) failed without reporting an error")
        index, exc_type, value, _trace = min(errors, key=lambda error: error[0])
        others = f" (and {failed - 1} more sub-env{'s' * (failed > 2)})" if failed > 1 else ""
        raise EnvWorkerError(f"env {self.env_id!r} sub-env {index} raised {exc_type.__name__}: "
                             f"{_one_line(value)}{others}")

    def _lost_worker(self, during: str, exc: BaseException) -> EnvWorkerError:
        """The error for a pipe that broke: the first worker found dead, by index."""
        ended = multiprocessing.connection.wait([p.sentinel for p in self.processes], timeout=1.0)
        for process in self.processes:
            if process.sentinel in ended:
                process.join(timeout=1.0)  # its files are closed; wait until its exit status is there too
        dead = [(i, p) for i, p in enumerate(self.processes) if not p.is_alive()]
        self._stop_workers()
        if not dead:
            return EnvWorkerError(f"env {self.env_id!r}: lost a worker during {during} "
                                  f"({type(exc).__name__}: {_one_line(exc)})")
        index, process = dead[0]
        return EnvWorkerError(f"env {self.env_id!r} sub-env {index} failed during {during}: {_exit_reason(process)}")

    def _guarded(self, during: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except (EOFError, OSError) as exc:  # a dead worker: EOF, broken pipe, connection reset
            raise self._lost_worker(during, exc) from None

    def step_async(self, actions: Any) -> None:
        self._guarded("step", super().step_async, actions)

    def step_wait(self, timeout: float | None = None) -> Any:
        return self._guarded("step", super().step_wait, timeout)

    def reset_async(self, seed: Any = None, options: dict[str, Any] | None = None) -> None:
        self._guarded("reset", super().reset_async, seed=seed, options=options)

    def reset_wait(self, timeout: float | None = None) -> Any:
        return self._guarded("reset", super().reset_wait, timeout)

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        self._guarded(f"call {name!r}", super().call_async, name, *args, **kwargs)

    def call_wait(self, timeout: float | None = None) -> Any:
        return self._guarded("call", super().call_wait, timeout)

    # ----------------------------------------------------------------- closing
    def _stop_workers(self) -> None:
        """Terminate (then, if need be, kill) every worker still running, close the pipes; marks the env closed.

        Workers go before their pipes: a worker that saw its pipe close first would print a traceback.
        """
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join(timeout=STOP_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join()
        for i, pipe in enumerate(self.parent_pipes):
            if pipe is not None:
                pipe.close()
                self.parent_pipes[i] = None
        self.closed = True

    def _finish_workers(self, timeout: float) -> None:
        """Send every worker ``close`` and wait for each to exit, its pipe still open.

        A worker may still owe the answer to a command sent before an interrupt (Ctrl-C inside
        ``step_async`` leaves some workers stepping while the env looks idle). Its answers, then its
        ``close`` acknowledgement, land in a pipe that stays open until it has exited, so it never
        writes to a closed pipe (gymnasium's own close reads one message per pipe and then closes them).
        """
        for pipe in self.parent_pipes:
            pipe.send(("close", None))
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))

    def close_extras(self, timeout: float | None = STOP_TIMEOUT_S, terminate: bool = False) -> None:
        """Ask the workers to finish (waiting for a pending step first); stop any that fail to."""
        timeout = STOP_TIMEOUT_S if timeout is None else timeout
        try:
            healthy = all(p is not None for p in self.parent_pipes) and all(p.is_alive() for p in self.processes)
            if not terminate and healthy:
                if self._state != AsyncState.DEFAULT:  # e.g. interrupted inside step(): collect that step first
                    getattr(self, f"{self._state.value}_wait")(timeout)
                if not self.closed:
                    self._finish_workers(timeout)
        except Exception:  # noqa: BLE001 - a broken or stuck worker while closing: stopped below
            pass
        finally:
            self._stop_workers()
