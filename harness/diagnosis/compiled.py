"""Compiled code seen from outside the compiled region: what a compiled call does, and torch.compile's own
account of its graph breaks and recompiles.

- ``CompiledCalls``: each compiled callable (a function ``torch.compile`` returned while the hooks were
  installed, or a compiled module) is timed around its call, never inside it. Its role is what it does:
  a call that steps an optimizer's parameters (their version counters move) is an update, with one
  optimizer step per optimizer stepped; any other is a forward whose role waits for what follows it, as
  a module's does (``phases``), reported at the call the loop makes.
- ``CompileLog``: dynamo's graph-break and recompile log records, kept (not printed) with their
  ``file:line`` and kind, from before the trainer is built, so breaks are named as the trainer has them.
"""

from __future__ import annotations

import gc
import linecache
import logging
import os
import re
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch

from harness.diagnosis.frames import LIBRARY_DIRS, RLGAUGE_DIRS
from harness.diagnosis.phases import rows_of


def is_compiled_module(module: Any) -> bool:
    """A module ``torch.compile`` returned (dynamo's ``OptimizedModule``)."""
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


class Stepping:
    """The optimizers built while the hooks are installed, and which of them a call stepped."""

    def __init__(self) -> None:
        self.optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._scanned = False

    def registering(self, init: Callable[..., Any]) -> Callable[..., Any]:
        """``Optimizer.__init__`` that also notes the optimizer built."""
        optimizers = self.optimizers

        def wrapped(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            init(optimizer, *args, **kwargs)
            optimizers.add(optimizer)

        wrapped.__wrapped__ = init  # type: ignore[attr-defined]
        return wrapped

    def versions(self) -> list[tuple[torch.optim.Optimizer, int]]:
        """Each optimizer with the sum of its parameters' version counters (an in-place step moves it)."""
        if not self.optimizers and not self._scanned:  # built before the hooks: found once among live objects
            self._scanned = True
            for obj in gc.get_objects():
                try:
                    if isinstance(obj, torch.optim.Optimizer):
                        self.optimizers.add(obj)
                except ReferenceError:  # a dead weak proxy among the live objects
                    continue
        return [(o, sum(p._version for g in o.param_groups for p in g["params"])) for o in list(self.optimizers)]

    @staticmethod
    def stepped(before: list[tuple[torch.optim.Optimizer, int]]) -> list[torch.optim.Optimizer]:
        return [o for o, version in before if sum(p._version for g in o.param_groups for p in g["params"]) != version]


@dataclass
class _Call:
    key: Any
    before: list[tuple[torch.optim.Optimizer, int]]
    eager_before: int
    role: str | None
    counted: bool


def _builds_graph(output: Any) -> bool:
    if not torch.is_grad_enabled():
        return False
    leaves = torch.utils._pytree.tree_leaves(output)
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in leaves)


class CompiledCalls:
    """Roles of compiled callables, learnt from their calls (the warm-up's, before any is counted)."""

    def __init__(self) -> None:
        self.stepping = Stepping()
        self.roles: dict[Any, str] = {}
        """``update`` or ``forward`` per compiled callable."""
        self.names: dict[Any, str] = {}
        self.sources: dict[str, list[tuple[int, int]]] = {}
        """Line ranges of the compiled functions' source by file: a finding there, seen in an eager replay
        (the audit), is not what the compiled code runs (``replayed``)."""
        self._stack: list[_Call] = []
        self.failed: dict[str, str] = {}
        """Compiled functions whose compilation failed, with the one-line reason: their eager path is diagnosed."""

    def note_source(self, fn: Any) -> None:
        """The source lines of a compiled callable (a function, bound method, or a compiled module's forward
        and the function a wrapper module holds, as TensorDict's ``TensorDictModule(update)`` does)."""
        candidates = [fn]
        if is_compiled_module(fn):
            inner = fn._orig_mod
            candidates = [getattr(inner, "forward", None), *(v for v in vars(inner).values() if callable(v))]
        for candidate in candidates:
            code = getattr(getattr(candidate, "__func__", candidate), "__code__", None)
            if code is None:
                continue
            lines = [line for _, _, line in code.co_lines() if line]
            if lines:
                span = (min(lines), max(lines))
                if span not in self.sources.setdefault(code.co_filename, []):
                    self.sources[code.co_filename].append(span)

    def replayed(self, where: str) -> bool:
        """``where`` (``file:line``) lies inside a compiled function: the audit saw it in an eager replay."""
        path, _, line = where.rpartition(":")
        return line.isdigit() and any(a <= int(line) <= b for a, b in self.sources.get(path, []))

    def wrap(self, view: Any, compiled: Callable[..., Any], original: Any) -> Callable[..., Any]:
        """A compiled function whose calls go through ``enter``/``leave`` (skipped by dynamo itself)."""
        calls = self

        name = getattr(original, "__qualname__", None) or type(original).__name__

        def compiled_call(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling():
                return compiled(*args, **kwargs)
            calls.enter(view, compiled_call, (*args, *kwargs.values()))
            view.counters.depth += 1
            output = None
            try:
                if name in calls.failed:
                    output = original(*args, **kwargs)
                    return output
                try:
                    output = compiled(*args, **kwargs)
                except torch._dynamo.exc.BackendCompilerFailed as exc:  # diagnosed eagerly from here on, said so
                    calls.failed[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
                    output = original(*args, **kwargs)
                return output
            finally:
                view.counters.depth = max(0, view.counters.depth - 1)
                calls.leave(view, compiled_call, output)

        from torch._dynamo.eval_frame import skip_code

        skip_code(compiled_call.__code__)
        compiled_call.__wrapped__ = compiled  # type: ignore[attr-defined]
        self.names[compiled_call] = name
        self.note_source(original)
        return compiled_call

    def running(self) -> str | None:
        """The name of the outermost compiled callable running now, or None outside compiled calls."""
        return self.names.get(self._stack[0].key, "compiled module") if self._stack else None

    def enter(self, view: Any, key: Any, inputs: tuple) -> None:
        clock, counters = view.clock, view.counters
        role = self.roles.get(key)
        if role is None and is_compiled_module(key):
            self.note_source(key)
            inner = key._orig_mod
            self.names[key] = getattr(getattr(inner, "module", None), "__qualname__", None) or type(inner).__name__
        counted = clock.enabled and clock.current is None
        self._stack.append(_Call(key, self.stepping.versions(), counters.eager_steps, role, counted))
        if role == "update":
            if counted:
                counters.resolve("update")
            clock.enter("update")
            return
        if counted:
            counters.forward_seen(False, rows_of(inputs), view.finder)
        clock.enter_forward(False)

    def leave(self, view: Any, key: Any, output: Any) -> None:
        clock, counters = view.clock, view.counters
        call = self._stack.pop() if self._stack else None
        if call is None:
            clock.leave()
            return
        stepped = self.stepping.stepped(call.before)
        compiled_steps = max(0, len(stepped) - (counters.eager_steps - call.eager_before))
        if stepped:
            self.roles[key] = "update"
            for optimizer in stepped if call.counted else ():
                counters.optimizers[id(optimizer)] = optimizer
                if compiled_steps:
                    counters.compiled_optimizers.add(id(optimizer))
        elif call.role is None:
            self.roles[key] = "forward"
        if call.counted:
            counters.optimizer_steps += compiled_steps
            counters.compiled_calls[self.roles[key]] += 1
            if call.role != "update" and stepped:  # learnt on this call: its forward was the update's
                counters.pending.pop()
                counters.resolve("update")
                clock.relabel("update")
            elif call.role != "update":
                builds = _builds_graph(output)
                counters.pending[-1].builds_graph = builds
                clock.mark_graph(builds)
        clock.leave()


_LOCATION = re.compile(r"in user code at (\S+?):(\d+)")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_LIBRARY = tuple(d + os.sep for d in LIBRARY_DIRS + RLGAUGE_DIRS)


def _module_of(where: str) -> str:
    """``torch/optim/optimizer.py`` of a library site (its path below site-packages), or the site itself."""
    path = where.rpartition(":")[0]
    return path.split("site-packages" + os.sep, 1)[-1] if "site-packages" in path else os.path.basename(path)
_KINDS = (("Tensor.backward", "backward()"), ("zero_grad", "optimizer.zero_grad()"),
          ("_dynamo.graph_break", "explicit torch._dynamo.graph_break()"), ("item()", ".item()"),
          ("Tensor.item", ".item()"), ("print", "print()"), ("data-dependent", "data-dependent branch"),
          ("Data-dependent", "data-dependent branch"), ("tolist", ".tolist()"), ("numpy", ".numpy()"),
          ("marked as skipped", "a function dynamo skips"), ("builtin", "an untraceable builtin"))


_BOILERPLATE = ("Graph break in user code", "Graph Break Reason", "Encountered graph break", "Failed to handle graph",
                "Skipping the function", "Graph break encountered", "Explanation", "Hint", "Developer debug",
                "For more details", "User code traceback", "File ", "Graph break (user stack", "Most recent bytecode")


def break_kind(text: str) -> str:
    """A short name for a graph break's reason (``backward()``, ``explicit torch._dynamo.graph_break()``...), with
    ``(the function runs eagerly)`` where dynamo gave up on the whole function."""
    kind = next((name for needle, name in _KINDS if needle in text), None)
    if kind is None:
        body = [line.strip() for line in text.splitlines()
                if line.strip() and not line.strip().startswith(_BOILERPLATE)]
        kind = body[0][:70] if body else "other"
    return kind + (" (the function runs eagerly)" if "Failed to handle graph break gracefully" in text else "")


def _wrapped_call(where: str, text: str) -> str | None:
    """``optimizer.zero_grad()`` (or ``torch.autograd.backward()``/``grad()``) where the source line at ``where``
    makes that call: a call rlgauge's hooks run eagerly, which dynamo breaks the graph at without them too."""
    path, _, line = where.rpartition(":")
    source = linecache.getline(path, int(line)) if line.isdigit() else ""
    for needle, kind in (("zero_grad", "optimizer.zero_grad()"), ("autograd.backward", "torch.autograd.backward()"),
                         ("autograd.grad", "torch.autograd.grad()")):
        if needle in source:
            return kind + (" (the function runs eagerly)" if "Failed to handle graph break" in text else "")
    return None


class CompileLog(logging.Handler):
    """Dynamo's graph-break and recompile records while installed, kept by ``file:line`` and kind."""

    LOGGERS = ("torch._dynamo.symbolic_convert.__graph_breaks", "torch._dynamo.guards.__recompiles")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.breaks: Counter[tuple[str, str]] = Counter()
        self.recompiles: list[str] = []
        self._saved: list[tuple[logging.Logger, int, bool]] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that does not format is not ours to raise
            return
        if record.name.endswith("__recompiles"):
            self.recompiles.append(" ".join(text.split())[:300])
            return
        found = _LOCATION.search(text)
        where = f"{found.group(1)}:{found.group(2)}" if found else "?"
        kind = break_kind(text)
        user = [f"{path}:{line}" for path, line in _FRAME.findall(text.partition("User code traceback:")[2])
                if not path.startswith(_LIBRARY)]
        if user and user[-1] != where:  # broken inside a library (torch's optimizer step): at the user's call
            kind, where = f"{kind} inside {_module_of(where)}", user[-1]
        if "disable()" in text:  # the phase hooks' eager wrappers: named as the call they wrap, which breaks alike
            kind = _wrapped_call(where, text) or kind
        self.breaks[(kind, where)] += 1

    def install(self) -> None:
        for name in self.LOGGERS:
            logger = logging.getLogger(name)
            self._saved.append((logger, logger.level, logger.propagate))
            logger.setLevel(logging.DEBUG)
            logger.propagate = False
            logger.addHandler(self)

    def remove(self) -> None:
        while self._saved:
            logger, level, propagate = self._saved.pop()
            logger.removeHandler(self)
            logger.setLevel(level)
            logger.propagate = propagate
