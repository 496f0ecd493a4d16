"""The user's source lines that launch the most kernels and take the most op time, by phase.

``LineKernels`` is a ``TorchDispatchMode`` for the audit: each dispatched op that runs a kernel
(views aside, ``loop_shape``) is counted at the user's ``file:line`` that made it, with the seconds
the op took. Its phase is the audit clock's: ops inside an update call are the update's; ops before
one (a forward, a loss, sampling a replay) wait for what follows, as the phase split does
(``phases``): an update call makes them the update's, an env step makes them acting.

``hot_lines`` ranks the dominant phase's lines; ``batch_loops`` finds the lines among them that a
Python ``for`` loop repeats many times per update with small ops: "a Python loop over the batch".
"""

from __future__ import annotations

import ast
import functools
import linecache
import re
import time
from collections import Counter
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from harness.diagnosis.frames import library_of
from harness.diagnosis.loop_shape import is_free

PHASE_OF = {"update": "update", "env": "env", "transfer": "transfer", "inference": "acting"}
SMALL_OP_ELEMENTS = 1024
"""Outputs of at most this many elements on average make a line's kernels small (launch-bound)."""
LOOP_KERNELS_PER_UPDATE = 16
"""A line inside a ``for`` loop launching at least this many kernels per optimizer step repeats per row."""
LOOP_RUNS_PER_UPDATE = 8
"""... and running at least this many times per optimizer step (a minibatch loop's body runs once a step)."""
_BATCH = re.compile(r"\.size\(0\)|\.shape\[0\]|\blen\(|batch|\brows?\b|\bnum_rows\b")
"""A loop header that iterates over the batch's rows (``range(target_pmfs.size(0))``), not over time steps."""


class LineKernels(TorchDispatchMode):
    """Kernels, op seconds and output elements by (phase, ``file:line``) while active."""

    def __init__(self, finder: Any, clock: Any) -> None:
        super().__init__()
        self.finder, self.clock = finder, clock
        self.kernels: Counter[tuple[str, str]] = Counter()
        self.seconds: Counter[tuple[str, str]] = Counter()
        self.elements: Counter[tuple[str, str]] = Counter()
        self.visits: Counter[tuple[str, str]] = Counter()
        """Runs of consecutive ops from one line: how many times the line itself ran (a loop body: once a row)."""
        self._pending: list[tuple[str, int, float, int, int]] = []
        self._last: tuple[str, int] | None = None
        self._fresh: str | None = None
        clock.listeners.append(self._settle)

    def _settle(self, event: str) -> None:
        """The ops waiting for a role take it: an update call's lead-in, an env step's acting, or the end's."""
        phase = {"update": "update", "env": "acting"}.get(event, "other")
        for where, kernels, seconds, elements, visit in self._pending:
            self.kernels[(phase, where)] += kernels
            self.seconds[(phase, where)] += seconds
            self.elements[(phase, where)] += elements
            self.visits[(phase, where)] += visit
        self._pending.clear()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        frame = self.finder.frame(2)
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
        position = (where, frame.f_lasti if frame is not None else 0)
        last, self._last = self._last, position  # views count here: a loop body's indexing marks a new row
        if last is None or last[0] != where or position[1] < last[1]:
            self._fresh = where  # a new run of this line: another line, or this one again from an earlier offset
        if is_free(func):
            return func(*args, **(kwargs or {}))
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        took = time.perf_counter() - start
        elements = int(getattr(out, "numel", lambda: 0)()) if hasattr(out, "numel") else 0
        visit = int(self._fresh == where)
        self._fresh = None if visit else self._fresh
        current = self.clock.current
        if current is None or current == "inference":
            self._pending.append((where, 1, took, elements, visit))
        else:
            key = (PHASE_OF.get(current, current), where)
            self.kernels[key] += 1
            self.seconds[key] += took
            self.elements[key] += elements
            self.visits[key] += visit
        return out


def hot_lines(counter: LineKernels, phase: str, updates: int, top: int = 5) -> list[dict[str, Any]]:
    """The ``phase``'s lines with the most kernels and op time: ``[{where, kernels, kernel_share, time_share,
    kernels_per_update, mean_elements}]``, most kernels first (then the lines with most time not among them)."""
    kernels = {w: n for (p, w), n in counter.kernels.items() if p == phase}
    seconds = {w: s for (p, w), s in counter.seconds.items() if p == phase}
    total_k, total_s = sum(kernels.values()) or 1, sum(seconds.values()) or 1e-12
    by_kernels = sorted(kernels, key=lambda w: -kernels[w])[:top]
    by_time = [w for w in sorted(seconds, key=lambda w: -seconds[w])[:top] if w not in by_kernels][:2]
    return [{"where": w, "kernels": kernels[w], "kernel_share": 100.0 * kernels[w] / total_k,
             "time_share": 100.0 * seconds.get(w, 0.0) / total_s,
             "kernels_per_update": kernels[w] / max(1, updates),
             "runs_per_update": counter.visits[(phase, w)] / max(1, updates),
             "mean_elements": counter.elements[(phase, w)] / max(1, kernels[w])} for w in by_kernels + by_time]


def batch_loops(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Hot lines inside a Python ``for`` loop that launch many small kernels per update: ``[{loop, where,
    kernels_per_update, kernel_share}]`` at the loop's own line."""
    found: dict[str, dict[str, Any]] = {}
    for line in lines:
        if line["kernels_per_update"] < LOOP_KERNELS_PER_UPDATE or line["mean_elements"] > SMALL_OP_ELEMENTS:
            continue
        if line.get("runs_per_update", 0.0) < LOOP_RUNS_PER_UPDATE:  # a minibatch loop runs its step once an update
            continue
        if library_of(line["where"]):  # a library's own loop is not the user's to vectorise
            continue
        path, _, number = line["where"].rpartition(":")
        loop = _enclosing_for(path, int(number)) if number.isdigit() else None
        if loop is None or not _BATCH.search(linecache.getline(path, loop)):  # over the batch, not over time steps
            continue
        where = f"{path}:{loop}"
        entry = found.setdefault(where, {"loop": where, "lines": [], "kernels_per_update": 0.0, "kernel_share": 0.0})
        entry["lines"].append(line["where"])
        entry["kernels_per_update"] += line["kernels_per_update"]
        entry["kernel_share"] += line["kernel_share"]
    return sorted(found.values(), key=lambda e: -e["kernels_per_update"])


def _enclosing_for(path: str, line: int) -> int | None:
    """The line of the innermost ``for`` statement (or comprehension) of ``path`` whose body holds ``line``."""
    best = None
    for start, end in _for_spans(path):
        if start <= line <= end and (best is None or start >= best[0]):
            best = (start, end)
    return best[0] if best else None


@functools.lru_cache(maxsize=64)
def _for_spans(path: str) -> tuple[tuple[int, int], ...]:
    source = "".join(linecache.getlines(path))
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    kinds = (ast.For, ast.AsyncFor, ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp)
    return tuple((node.lineno, node.end_lineno or node.lineno) for node in ast.walk(tree) if isinstance(node, kinds))


def hot_summary(counter: LineKernels | None, phases: dict[str, float], updates: int) -> dict[str, Any]:
    """``{phase, lines, batch_loops}``: the dominant phase's hottest lines and the update's Python batch loops."""
    shares = {"update": phases["update"], "acting": phases["inference"], "env": phases["env"],
              "transfer": phases["transfer"]}
    phase = max(shares, key=lambda name: shares[name])
    if counter is None:
        return {"phase": phase, "lines": [], "batch_loops": []}
    return {"phase": phase, "lines": hot_lines(counter, phase, updates),
            "batch_loops": batch_loops(hot_lines(counter, "update", updates, top=10))}
