"""Wall time split into phases with no instrumentation: the clock and counters the hooks (``hooks``) feed.

- ``env``: an env's ``step``/``reset`` wherever the env is stepped: gymnasium's ``Env`` and ``VectorEnv``,
  TorchRL's ``EnvBase`` (``step_and_maybe_reset`` too), SB3's ``VecEnv``, EnvPool (every subclass loaded,
  so a library's wrapper around gymnasium is one env call);
- ``inference``: acting: a module forward followed by an env step before any update call (under
  ``no_grad`` or not: an acting forward that builds a graph nobody uses is still acting, and a
  finding), and the work from it to the env step that takes its actions (sampling, the host copy
  of the actions);
- ``update``: a forward followed by an update call (``backward``, ``autograd.grad``,
  ``clip_grad_norm_``, optimizer ``step``/``zero_grad``; a target network's forward under
  ``no_grad`` too), those calls themselves, and the work since the last env step or update call
  that leads into it (sampling a replay, advantages): work between an env step and an update
  belongs to that update, except the loop's work on the rollout just taken where the first hooked
  event after the env step is a forward (storing the step, stacking the rollout before a
  bootstrap value or a compiled GAE: ``other``); a graph-building forward that neither follows is
  the update's;
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
kind, and note the optimizers that step (``loop_shape``). A compiled callable is one call of its role
(``compiled``): an update when it steps an optimizer, else a forward.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

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
        self._tail_from: float | None = None
        self._tail = 0.0
        self.listeners: list[Callable[[str], None]] = []
        """Told ``update`` as an outermost update call starts (its lead-in is the update's), ``env`` as an env
        step starts (the work since the last one acted), ``end`` at the end of an ``iterate()`` call."""

    @property
    def current(self) -> str | None:
        return self._stack[0] if self._stack else None

    def enter(self, phase: str) -> None:
        if not self.enabled:
            return
        if not self._stack:
            for listener in self.listeners if phase in ("env", "update") else ():
                listener(phase)
            now = time.perf_counter()
            self._end_tail(now, phase == "inference")
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

    def relabel(self, phase: str) -> None:
        """The outermost phase running is ``phase`` after all (a compiled call found to step an optimizer)."""
        if self._stack:
            self._stack[0] = phase
            self._entered_graph = False

    def mark_graph(self, builds_graph: bool) -> None:
        """The outermost forward running built an autograd graph (known only once a compiled call returns)."""
        if len(self._stack) == 1:
            self._entered_graph = builds_graph

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
            self._tail_from, self._tail = (now if phase == "env" else None), 0.0
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
        self._end_tail(now, False)
        if self._anchor is not None:
            self._lead_transfer = max(0.0, now - self._anchor - self._since_anchor["transfer"])
        if self._gap_started is not None:
            self._gap_transfer = max(0.0, now - self._gap_started - self._hooked_in_gap)

    def _lead_in(self, now: float) -> None:
        """The time since the last env step or update call, transfers aside, becomes update time (transfer up to
        its last tensor made from NumPy data)."""
        assert self._anchor is not None
        tail, self._tail = self._tail, 0.0  # the loop's own work right after an env step (storing it) is not moved
        moved = max(0.0, now - self._anchor - self._since_anchor["transfer"] - tail)
        handed_over = min(moved, max(0.0, self._lead_transfer - tail))  # a minibatch assembled on the host
        self.seconds["inference"] -= self._since_anchor["inference"]
        self.seconds["transfer"] += handed_over
        self.seconds["update"] += moved - handed_over
        self._lead_transfer = 0.0
        self._hooked_in_gap += moved - self._since_anchor["inference"]
        self._since_anchor = dict.fromkeys(HOOKED_PHASES, 0.0)
        self.update_host_tensors += self.host_tensors_since_anchor
        self.host_tensors_since_anchor = 0

    def _end_tail(self, now: float, kept: bool) -> None:
        """The first hooked event after an env step ends its tail. Where it is a forward (the bootstrap value, a
        compiled GAE), the tail was the loop's work on the rollout just taken (storing the step, stacking the
        rollout): ``kept``, it stays ``other`` rather than leading into an update; where it is a tensor made from
        NumPy data or a copy, the tail assembled a minibatch and leads in as before."""
        if self._tail_from is not None:
            self._tail, self._tail_from = (now - self._tail_from if kept else 0.0), None

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
        for listener in self.listeners:
            listener("end")
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
        self._tail_from, self._tail = None, 0.0
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
    site: tuple[str, ...] | None
    """The user's frames the call came through, innermost first (``frames.SiteFinder.chain``); None unsampled."""
    watched: bool = False


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
        self.eager_steps = 0
        """Optimizer steps whose hooks ran in Python (not inside compiled code), counted or not."""
        self.eager_optimizers: set[int] = set()
        """Ids of the optimizers whose step hooks ran in Python."""
        self.compiled_optimizers: set[int] = set()
        """Ids of the optimizers stepped inside compiled code (``compiled``)."""
        self.compiled_syncs: Counter[str] = Counter()
        """``.item()`` calls made while a compiled callable ran, by its name (the compiled path's own syncs)."""
        self.compiled_calls: Counter[str] = Counter()
        """Counted calls of compiled callables by role (``update``, ``forward``)."""
        self.env_classes: Counter[str] = Counter()
        self.env_step_calls = 0
        """Outermost env ``step`` calls (a vector env's step is one)."""
        self.inference_sites: Counter[tuple[str, ...]] = Counter()
        """Where the first ``SITE_SAMPLES`` outermost acting forwards were called from (their frame chains)."""
        self.update_lines: set[str] = set()
        """Every ``file:line`` on the sampled update forwards' frame chains: a line the update runs too."""
        self.graph_used: set[tuple[str, ...]] = set()
        """Chains of acting forwards whose autograd graph a backward went through after all."""
        self.inference_rows = 0
        """Rows (first dimension of the first tensor input; a 1-D input is one row) of the acting forwards."""
        self.graph_acting: Counter[tuple[str, ...]] = Counter()
        """Acting forwards that built an autograd graph nobody used, by site (``?`` past the sampled ones)."""
        self.update_syncs: Counter[Any] = Counter()
        """Host-sync keys made inside an update call or on the way into one (a loss's statistics)."""
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
            site = finder.chain(3)
        self.pending.append(_Forward(builds_graph, rows, site))

    def watch_graph(self, output: Any) -> None:
        """The forward just seen built a graph: note it if a backward ever goes through it (then its graph was
        used, and acting under ``no_grad`` there would break the update)."""
        forward = self.pending[-1] if self.pending else None
        if forward is None or forward.site is None or forward.watched or not forward.builds_graph:
            return
        forward.watched = True
        leaves = torch.utils._pytree.tree_leaves(output)
        grad_fn = next((x.grad_fn for x in leaves if isinstance(x, torch.Tensor) and x.grad_fn is not None), None)
        if grad_fn is not None:
            chain, used = forward.site, self.graph_used
            grad_fn.register_prehook(lambda *_: used.add(chain))

    def site_of(self, chain: tuple[str, ...]) -> str:
        """Where an acting forward is reported: the innermost frame of its chain that no update forward runs
        through (the loop's call, not a line inside a method the update also calls)."""
        return next((where for where in chain if where not in self.update_lines), chain[-1] if chain else "?")

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
                    self.graph_acting[forward.site or ("?",)] += 1
            elif forward.site is not None and len(self.update_lines) < 4 * SITE_SAMPLES:
                self.update_lines.update(forward.site)
        if role == "inference":
            self.acting_syncs.update(self.pending_syncs)
        elif role == "update":
            self.update_syncs.update(self.pending_syncs)
        self.pending.clear()
        self.pending_syncs.clear()

    def acting_sites(self) -> list[str]:
        """The three most frequent acting call sites, each at the loop's call (``site_of``)."""
        sites: Counter[str] = Counter()
        for chain, count in self.inference_sites.items():
            sites[self.site_of(chain)] += count
        return [where for where, _ in sites.most_common(3)]

    def unused_acting_graphs(self, steps: int) -> list[dict[str, Any]]:
        """``[{where, per_env_step}]``: acting forwards that built a graph no backward went through, by the loop's
        call site (the unsampled ones at the most frequent sampled site)."""
        sites: Counter[str] = Counter()
        sampled = [chain for chain in self.graph_acting if chain != ("?",)]
        all_used = bool(sampled) and all(chain in self.graph_used for chain in sampled)
        for chain, count in self.graph_acting.items():
            if chain not in self.graph_used and not (chain == ("?",) and all_used):
                sites[self.site_of(chain) if chain != ("?",) else "?"] += count
        unsampled = sites.pop("?", 0)
        if unsampled and sites:
            sites[sites.most_common(1)[0][0]] += unsampled
        elif unsampled:
            sites["?"] = unsampled
        return [{"where": where, "per_env_step": count / steps} for where, count in sites.most_common()]

    def sync_seen(self, key: Any) -> None:
        """A host sync (``host_syncs``): acting when an env step follows before an update call."""
        if self.pending:
            self.pending_syncs.append(key)


def rows_of(inputs: tuple) -> int:
    """Rows of a forward: the first dimension of a batched input; a 0-D or 1-D input is one row."""
    first = next((x for x in inputs if isinstance(x, torch.Tensor)), None)
    return 1 if first is None or first.dim() <= 1 else int(first.shape[0])
