"""Arm processes forked from a warm one: ``python -m harness.trials.processes.zygote FD`` imports torch (its compiler's
front end too, which the first optimizer built imports), gymnasium and the child's own modules once, then forks a
fresh arm process (``child``) for each request, so that a try's dozens of processes do not each pay seconds of
imports before their trainer is built.

The forked process is as fresh as a new one where it matters: nothing has run a torch op in the zygote (no
thread pool, no allocator state, no setting changed), the user's modules are imported only after the fork, and
every arm, the unchanged one included, comes from the same zygote. The parent talks to it over a Unix socket:
a request is a JSON line with the arm's stdin, stdout and stderr passed as file descriptors; the answer is the
forked process's pid, and later its exit code (``ForkedProcess`` waits on it as ``subprocess.Popen`` would).
Where the zygote cannot start, arms start as plain processes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

PRELOADED = ("torch", "torch._dynamo", "torch.distributions", "torch.optim", "numpy", "gymnasium",
             "harness.trials.processes.child", "harness.trials.runtime_patches", "harness.measurement.runner",
             "harness.specs.own_trainer", "harness.specs.presets")
"""What the zygote imports before it forks: what every arm process imports before its trainer is built."""
MAX_FDS = 3


def serve(fd: int) -> int:
    """The zygote's loop: fork an arm process per request until the parent closes the socket."""
    import importlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the arms and the parent; it ends with the socket
    for name in PRELOADED:
        importlib.import_module(name)
    channel = socket.socket(fileno=fd)
    channel.sendall(b'{"ready": true}\n')
    buffer = b""
    while True:
        _reap(channel)
        readable = _wait_readable(channel, 0.05)
        if not readable:
            continue
        message, fds, _flags, _addr = socket.recv_fds(channel, 65536, MAX_FDS)
        if not message:
            break
        buffer += message
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            pid = _fork(json.loads(line)["argv"], fds, channel)
            for received in fds:
                os.close(received)
            fds = []
            channel.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    while True:  # the parent is gone: wait for what is left
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return 0


def _wait_readable(channel: socket.socket, timeout: float) -> bool:
    import select

    return bool(select.select([channel], [], [], timeout)[0])


def _reap(channel: socket.socket) -> None:
    """Each arm process that ended: its exit code to the parent (a signal's as ``-signal``, as Popen gives it)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        channel.sendall(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


def _fork(argv: list[str], fds: list[int], channel: socket.socket) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        channel.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, source in enumerate(fds):
            os.dup2(source, target)
        for source in fds:
            if source > 2:
                os.close(source)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own streams
        sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
        from harness.trials.processes import child

        code = child.main(argv)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - the arm's log says what; its exit code that it failed
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream has nothing to flush
                pass
        os._exit(code)
    return 0  # not reached


class Zygote:
    """The parent's side: the zygote's process and socket; ``spawn`` forks an arm process through it."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen([sys.executable, "-m", "harness.trials.processes.zygote", str(theirs.fileno())],
                                        pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        self._socket = ours
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._pids: list[int] = []
        self.exits: dict[int, int] = {}
        self.alive = True
        self._reader = ours.makefile("rb")
        first = self._reader.readline()
        if not first or not json.loads(first).get("ready"):
            raise OSError("the zygote did not start")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._reader:
            message = json.loads(line)
            with self._changed:
                if "pid" in message:
                    self._pids.append(int(message["pid"]))
                else:
                    self.exits[int(message["exit"])] = int(message["code"])
                self._changed.notify_all()
        with self._changed:
            self.alive = False
            self._changed.notify_all()

    def spawn(self, argv: list[str], stdin: int, stdout: int, stderr: int) -> ForkedProcess:
        """An arm process forked with these file descriptors as its standard streams (the caller closes its own)."""
        with self._lock, self._changed:
            count = len(self._pids)
            socket.send_fds(self._socket, [json.dumps({"argv": argv}).encode() + b"\n"], [stdin, stdout, stderr])
            while len(self._pids) == count:
                if not self.alive or not self._changed.wait(timeout=30):
                    raise OSError("the zygote did not answer")
            return ForkedProcess(self, self._pids[-1])

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self.exits or not self.alive, timeout=timeout)
            return self.exits.get(pid)

    def close(self) -> None:
        try:
            self._socket.shutdown(socket.SHUT_RDWR)  # the reader's file keeps the socket open: end it for the zygote
            self._socket.close()
            self.process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()


class ForkedProcess:
    """An arm process forked by the zygote, waited on as a ``subprocess.Popen``: ``poll``, ``wait``, ``kill``."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote, self.pid = zygote, pid
        self.returncode: int | None = None
        self.stdin: Any = None
        self.stdout: Any = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, timeout)
        if self.returncode is None:
            if not self.zygote.alive:
                self.returncode = -signal.SIGKILL
            else:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
