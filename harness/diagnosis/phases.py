"""Wall time split into phases with no instrumentation: torch's global hooks and a few wrappers.

- ``env``: gymnasium ``Env.step``/``reset`` and ``VectorEnv.step``/``reset`` (every subclass
  loaded, so a backend that wraps them is one env call);
- ``inference``: acting: a module forward followed by an env step before any update call (under
  ``no_grad`` or not: an acting forward that builds a graph nobody uses is still acting, and a
  finding), and the work from it to the env step that takes its actions (sampling, the host copy
  of the actions);
- ``update``: a forward followed by an update call (``backward``, ``autograd.grad``,
  ``clip_grad_norm_``, optimizer ``step``/``zero_grad``; a target network's forward under
  ``no_grad`` too), those calls themselves, and the work since the last env step or update call
  that leads into it (sampling a replay, advantages): work between an env step and an update
  belongs to that update; a graph-building forward that neither follows is the update's;
- ``transfer``: a tensor made from NumPy data, and copies across devices (``to``, ``cpu``, ``cuda``);
- ``other``: the rest of ``iterate()`` (bookkeeping, logging, Python).

Work no hook sees (a NumPy learner, say) is attributed by its rhythm: the unhooked time
between two env steps is the loop's per-step work; a gap whose unhooked time exceeds
``BURST_FACTOR`` times the median gap is a burst that runs on some steps only, the learner's:
its excess over the median counts as ``update``. A loop that steps its envs with no inference
forward at all acts some other way (NumPy, say): its per-step work, the gaps outside bursts,
counts as ``inference`` (choosing the actions is the one thing every step must do), except the
part of each gap up to its last tensor made from NumPy data, which stores the step for torch:
``transfer``. Likewise the part of an update's lead-in up to its last tensor made from NumPy data
assembles a minibatch on the host and hands it over: ``transfer``; the rest is ``update``.

The outermost phase wins: a forward inside an env step is env time, a backward inside a
forward is the forward's (no double counting). The same hooks count outermost forwards, by
kind, and note the optimizers that step (``loop_shape``).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

HOOKED_PHASES: tuple[str, ...] = ("env", "inference", "update", "transfer")
SHOWN_PHASES: tuple[str, ...] = HOOKED_PHASES + ("other",)
BURST_FACTOR = 3.0
SITE_SAMPLES = 256


class PhaseClock:
    """Seconds per phase, outermost phase wins; with the update's lead-in rule (module doc)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(HOOKED_PHASES, 0.0)
        self.enabled = False
        self._stack: list[str] = []
        self._started = 0.0
        self._anchor: float | None = None
        self._since_anchor: dict[str, float] = dict.fromkeys(HOOKED_PHASES, 0.0)
        self.host_tensors_since_anchor = 0
        self._gap_started: float | None = None
        self._hooked_in_gap = 0.0
        self.gaps: list[float] = []
        """Unhooked seconds between consecutive env steps (and before the first, after the last, of a call)."""
        self._acting_from: float | None = None
        self._hooked_since_acting = 0.0
        self.update_host_tensors = 0
        """Tensors made from NumPy data inside an update or on the way into one (sampling a replay)."""
        self._lead_transfer = 0.0
        self._gap_transfer = 0.0
        self.gap_transfers: list[float] = []
        """Of each gap, the unhooked seconds up to its last tensor made from NumPy data (the step's data handed over)."""
        self._graph_forward_seconds = 0.0
        """Seconds of graph-building forwards booked as inference since the last env step or update: an update call
        takes them with its lead-in, an env step keeps them as acting, the end of a call gives them to ``update``."""
        self._entered_graph = False

    @property
    def current(self) -> str | None:
        return self._stack[0] if self._stack else None

    def enter(self, phase: str) -> None:
        if not self.enabled:
            return
        if not self._stack:
            now = time.perf_counter()
            if phase in ("env", "inference"):
                self._close_acting(now)
            if phase == "update" and self._anchor is not None:
                self._lead_in(now)
            elif phase == "env":
                self._close_gap(now)
            self._started = now
        self._stack.append(phase)

    def enter_forward(self, builds_graph: bool) -> None:
        """An outermost module forward: inference until what follows it decides (module doc)."""
        if self.enabled and not self._stack:
            self._entered_graph = builds_graph
        self.enter("inference")

    def leave(self) -> None:
        if not self._stack:
            return
        phase = self._stack.pop()
        if self._stack:
            return
        now = time.perf_counter()
        self.seconds[phase] += now - self._started
        if phase == "inference" and self._entered_graph:
            self._graph_forward_seconds += now - self._started
        self._entered_graph = False
        if phase == "env":
            self._gap_started, self._hooked_in_gap = now, 0.0
        else:
            self._hooked_in_gap += now - self._started
            self._hooked_since_acting += now - self._started
        if phase == "inference":
            self._acting_from, self._hooked_since_acting = now, 0.0
        elif phase == "update":
            self._acting_from = None
        if phase in ("env", "update"):
            self._graph_forward_seconds = 0.0
            self._anchor, self._lead_transfer = now, 0.0
            self._since_anchor = dict.fromkeys(HOOKED_PHASES, 0.0)
            self.host_tensors_since_anchor = 0
        else:
            self._since_anchor[phase] += now - self._started

    def host_tensor_made(self) -> None:
        """A tensor made from NumPy data has just been made (outside any phase): the work before it since the
        last env step or update, and in this gap, prepared data for torch (the ``transfer`` splits above)."""
        if not self.enabled or self._stack:
            return
        now = time.perf_counter()
        if self._anchor is not None:
            self._lead_transfer = max(0.0, now - self._anchor - self._since_anchor["transfer"])
        if self._gap_started is not None:
            self._gap_transfer = max(0.0, now - self._gap_started - self._hooked_in_gap)

    def _lead_in(self, now: float) -> None:
        """The time since the last env step or update call, transfers aside, becomes update time (transfer up to
        its last tensor made from NumPy data)."""
        assert self._anchor is not None
        moved = now - self._anchor - self._since_anchor["transfer"]
        handed_over = min(moved, self._lead_transfer)  # a minibatch assembled on the host, up to its tensors
        self.seconds["inference"] -= self._since_anchor["inference"]
        self.seconds["transfer"] += handed_over
        self.seconds["update"] += moved - handed_over
        self._lead_transfer = 0.0
        self._hooked_in_gap += moved - self._since_anchor["inference"]
        self._since_anchor = dict.fromkeys(HOOKED_PHASES, 0.0)
        self.update_host_tensors += self.host_tensors_since_anchor
        self.host_tensors_since_anchor = 0

    def _close_acting(self, now: float) -> None:
        """The unhooked time from the last inference forward to now (an env step or the next forward) is acting."""
        if self._acting_from is None:
            return
        tail = max(0.0, now - self._acting_from - self._hooked_since_acting)
        self.seconds["inference"] += tail
        self._since_anchor["inference"] += tail
        self._hooked_in_gap += tail
        self._acting_from = None

    def _close_gap(self, now: float) -> None:
        if self._gap_started is not None:
            gap = max(0.0, now - self._gap_started - self._hooked_in_gap)
            self.gaps.append(gap)
            self.gap_transfers.append(min(gap, self._gap_transfer))
        self._gap_started, self._hooked_in_gap, self._gap_transfer = None, 0.0, 0.0

    def end_window(self) -> None:
        """The end of an ``iterate()`` call: the time since its last env step is a gap too; graph-building
        forwards no env step followed are the update's (a loss whose backward this call did not reach)."""
        self._close_gap(time.perf_counter())
        self.seconds["inference"] -= self._graph_forward_seconds
        self.seconds["update"] += self._graph_forward_seconds
        self._graph_forward_seconds = 0.0

    def _median_gap(self) -> float | None:
        """The median gap; None with fewer than three gaps, too few to tell a burst."""
        return sorted(self.gaps)[len(self.gaps) // 2] if len(self.gaps) >= 3 else None

    def burst_seconds(self) -> float:
        """Unhooked time in bursts: each gap's excess over the median gap, where it exceeds ``BURST_FACTOR`` x it."""
        median = self._median_gap()
        if median is None:
            return 0.0
        return sum(gap - median for gap in self.gaps if gap > BURST_FACTOR * median)

    def steady_split(self) -> tuple[float, float]:
        """The loop's per-step work (unhooked time between env steps, bursts aside) as (transfer, acting): in each
        gap, the part up to its last tensor made from NumPy data hands the step's data over, the rest acts."""
        median = self._median_gap()
        handed_over = acting = 0.0
        for gap, transfer in zip(self.gaps, self.gap_transfers):
            steady = gap if median is None or gap <= BURST_FACTOR * median else median
            handed_over += min(transfer, steady)
            acting += steady - min(transfer, steady)
        return handed_over, acting

    def start_window(self) -> None:
        """A new ``iterate()`` call: no lead-in reaches back before it."""
        self._gap_started, self._hooked_in_gap, self._gap_transfer = time.perf_counter(), 0.0, 0.0
        self._acting_from, self._lead_transfer = None, 0.0
        self._anchor = time.perf_counter()
        self._since_anchor = dict.fromkeys(HOOKED_PHASES, 0.0)
        self.host_tensors_since_anchor = 0
        self._graph_forward_seconds = 0.0

    def count_host_tensor(self) -> None:
        """A tensor made from NumPy data: an update's if one runs, else pending until the next update or env step."""
        if self.current == "update":
            self.update_host_tensors += 1
        else:
            self.host_tensors_since_anchor += 1

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.enter(name)
        try:
            yield
        finally:
            self.leave()


@dataclass
class _Forward:
    """An outermost forward whose role (acting or update) waits for what follows it."""

    builds_graph: bool
    rows: int
    site: str | None


class LoopCounters:
    """What the hooks count besides time: outermost forwards by role, optimizers stepped, env calls.

    A forward's role is what follows it: an env step makes the forwards since the last env step or
    update acting (``inference``), whatever their autograd state; a backward, optimizer step,
    ``zero_grad`` or ``clip_grad_norm_`` makes them the update's (a target network's forward under
    ``no_grad`` too); the end of an ``iterate()`` call decides by whether they built a graph.
    Host syncs made while forwards wait (``pending_syncs``) share their fate: acting or not."""

    def __init__(self) -> None:
        self.forwards: Counter[str] = Counter()
        self.optimizers: dict[int, torch.optim.Optimizer] = {}
        self.optimizer_steps = 0
        self.env_classes: Counter[str] = Counter()
        self.env_step_calls = 0
        """Outermost env ``step`` calls (a vector env's step is one)."""
        self.inference_sites: Counter[str] = Counter()
        """Where the first ``SITE_SAMPLES`` outermost acting forwards were called from (``file:line``)."""
        self.inference_rows = 0
        """Rows (first dimension of the first tensor input; a 1-D input is one row) of the acting forwards."""
        self.graph_acting: Counter[str] = Counter()
        """Acting forwards that built an autograd graph nobody used, by site (``?`` past the sampled ones)."""
        self.acting_syncs: Counter[Any] = Counter()
        """Host-sync keys made while acting: between a forward and the env step that takes its actions."""
        self.pending: list[_Forward] = []
        self.pending_syncs: list[Any] = []
        self.depth = 0
        self._sampled = 0

    def forward_seen(self, builds_graph: bool, rows: int, finder: Any) -> None:
        """An outermost forward: pending until an env step or an update call decides its role."""
        site = None
        if finder is not None and self._sampled < 4 * SITE_SAMPLES:
            self._sampled += 1
            site = finder.where(3)
        self.pending.append(_Forward(builds_graph, rows, site))

    def resolve(self, role: str | None) -> None:
        """The pending forwards take ``role`` (``inference``, ``update``; None: by their autograd state)."""
        for forward in self.pending:
            kind = role or ("update" if forward.builds_graph else "inference")
            self.forwards[kind] += 1
            if kind == "inference":
                self.inference_rows += forward.rows
                if forward.site is not None and self.inference_sites.total() < SITE_SAMPLES:
                    self.inference_sites[forward.site] += 1
                if forward.builds_graph:
                    self.graph_acting[forward.site or "?"] += 1
        if role == "inference":
            self.acting_syncs.update(self.pending_syncs)
        self.pending.clear()
        self.pending_syncs.clear()

    def sync_seen(self, key: Any) -> None:
        """A host sync (``host_syncs``): acting when an env step follows before an update call."""
        if self.pending:
            self.pending_syncs.append(key)


def _builds_graph(module: torch.nn.Module, inputs: tuple) -> bool:
    if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        return False
    if any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs):
        return True
    return any(p.requires_grad for p in module.parameters())


def _rows(inputs: tuple) -> int:
    """Rows of a forward: the first dimension of a batched input; a 0-D or 1-D input is one row."""
    first = next((x for x in inputs if isinstance(x, torch.Tensor)), None)
    return 1 if first is None or first.dim() <= 1 else int(first.shape[0])


def _device_of(args: tuple, kwargs: dict) -> torch.device | None:
    target = kwargs.get("device")
    if target is None:
        for arg in args:
            if isinstance(arg, (str, torch.device)) and not isinstance(arg, torch.dtype):
                target = arg
                break
            if isinstance(arg, torch.Tensor):
                target = arg.device
                break
    try:
        return None if target is None else torch.device(target)
    except (RuntimeError, TypeError):
        return None


def _env_classes() -> list[type]:
    """gymnasium's Env and VectorEnv and every subclass loaded now."""
    import gymnasium

    seen: list[type] = []
    todo: list[type] = [gymnasium.Env, gymnasium.vector.VectorEnv]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.append(cls)
            todo.extend(cls.__subclasses__())
    return seen


class Patches:
    """Attribute patches undone in reverse order."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def replace(self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        had_own = name in vars(owner)
        original = getattr(owner, name)
        setattr(owner, name, make(original))
        self._undo.append(lambda: setattr(owner, name, original) if had_own else delattr(owner, name))

    def handle(self, handle: Any) -> None:
        self._undo.append(handle.remove)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


def _timed(clock: PhaseClock, phase: str, original: Callable[..., Any],
           counters: "LoopCounters | None" = None) -> Callable[..., Any]:
    """``original`` timed as ``phase``; an outermost update call decides the pending forwards' role."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if counters is not None and clock.enabled and clock.current is None:
            counters.resolve(phase)
        clock.enter(phase)
        try:
            return original(*args, **kwargs)
        finally:
            clock.leave()

    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapped


def _copy(clock: PhaseClock, original: Callable[..., Any], default_target: str | None) -> Callable[..., Any]:
    """A tensor method that copies across devices when its target device differs from the tensor's."""

    def wrapped(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        target = torch.device(default_target) if default_target else _device_of(args, kwargs)
        if target is None or target.type == tensor.device.type:
            return original(tensor, *args, **kwargs)
        clock.enter("transfer")
        try:
            return original(tensor, *args, **kwargs)
        finally:
            clock.leave()

    return wrapped


def _env_call(clock: PhaseClock, counters: "LoopCounters", original: Callable[..., Any]) -> Callable[..., Any]:
    """An env's ``step``/``reset``: env time, and the class of the outermost env called."""

    def wrapped(env: Any, *args: Any, **kwargs: Any) -> Any:
        if clock.enabled and clock.current is None:
            counters.env_classes[type(env).__name__] += 1
            if original.__name__ == "step":
                counters.env_step_calls += 1
                counters.resolve("inference")
        clock.enter("env")
        try:
            return original(env, *args, **kwargs)
        finally:
            clock.leave()

    return wrapped


def _from_host(clock: PhaseClock, original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.tensor``/``as_tensor``/``from_numpy``: a NumPy input is a host->device copy's start."""

    def wrapped(data: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(data, np.ndarray):
            return original(data, *args, **kwargs)
        if clock.enabled:
            clock.count_host_tensor()
        clock.enter("transfer")
        try:
            return original(data, *args, **kwargs)
        finally:
            clock.leave()
            clock.host_tensor_made()

    return wrapped


@contextlib.contextmanager
def hooks(clock: PhaseClock, counters: LoopCounters, finder: Any = None) -> Iterator[None]:
    """Install every hook and wrapper; remove them all on leaving, whatever happens. ``finder``
    (a ``frames.SiteFinder``) notes where inference forwards are called from."""
    patches = Patches()

    def forward_pre(module: torch.nn.Module, inputs: tuple) -> None:
        if counters.depth == 0:
            builds_graph = _builds_graph(module, inputs)
            if clock.enabled and clock.current is None:
                counters.forward_seen(builds_graph, _rows(inputs), finder)
            clock.enter_forward(builds_graph)
        else:
            clock.enter("inference")  # nested: the outer phase already runs, this one is not counted
        counters.depth += 1

    def forward_post(module: torch.nn.Module, inputs: tuple, output: Any) -> None:
        counters.depth = max(0, counters.depth - 1)
        clock.leave()

    def step_pre(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        counters.optimizers[id(optimizer)] = optimizer
        if clock.enabled:
            counters.optimizer_steps += 1
            if clock.current is None:
                counters.resolve("update")
        clock.enter("update")

    def step_post(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        clock.leave()

    try:
        patches.handle(nn_module.register_module_forward_pre_hook(forward_pre))
        patches.handle(nn_module.register_module_forward_hook(forward_post, always_call=True))
        patches.handle(optim_module.register_optimizer_step_pre_hook(step_pre))
        patches.handle(optim_module.register_optimizer_step_post_hook(step_post))
        for owner, name in ((torch.Tensor, "backward"), (torch.autograd, "backward"), (torch.autograd, "grad"),
                            (torch.optim.Optimizer, "zero_grad"), (torch.nn.utils, "clip_grad_norm_")):
            patches.replace(owner, name, lambda f: _timed(clock, "update", f, counters))
        for cls in _env_classes():
            for name in ("step", "reset"):
                if name in vars(cls):
                    patches.replace(cls, name, lambda f: _env_call(clock, counters, f))
        patches.replace(torch.Tensor, "to", lambda f: _copy(clock, f, None))
        patches.replace(torch.Tensor, "cpu", lambda f: _copy(clock, f, "cpu"))
        patches.replace(torch.Tensor, "cuda", lambda f: _copy(clock, f, "cuda"))
        for name in ("tensor", "as_tensor", "from_numpy"):
            patches.replace(torch, name, lambda f: _from_host(clock, f))
        yield
    finally:
        patches.undo()
