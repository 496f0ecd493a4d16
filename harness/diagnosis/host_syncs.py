"""Device->host synchronisations by kind, with the user's ``file:line`` of each.

A ``TorchFunctionMode`` sees every tensor method the trainer calls. Counted, by kind:
``.item()`` (and ``float(t)``/``int(t)``), ``.cpu()/.numpy()/.tolist()``, ``bool(t)``/``if t``,
``nonzero``/boolean-mask indexing (a data-dependent shape), and ``.to("cpu")``. On an
accelerator a call counts when its tensor lives there; on the CPU nothing synchronises, so
the calls count as they would on an accelerator (``.cpu()``/``.to("cpu")`` of a CPU tensor are
free there, and its ``.numpy()`` is counted once). On CUDA, ``torch.cuda.set_sync_debug_mode``
("warn") also reports the synchronisations torch itself makes; their warnings are counted.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode

import sys

from harness.diagnosis.frames import SiteFinder, context_of, library_of

ITEM, HOST_COPY, BRANCH, DATA_SHAPE, TO_CPU, CUDA_SYNC, TO_DEVICE = (
    ".item()", ".cpu()/.numpy()/.tolist()", "bool(t)/if t", "nonzero/boolean mask", '.to("cpu")',
    "cuda sync (set_sync_debug_mode)", "blocking copy to the device")

_T = torch.Tensor
_BY_FUNCTION: dict[Any, str] = {
    _T.item: ITEM, _T.__float__: ITEM, _T.__int__: ITEM, _T.__index__: ITEM,
    _T.numpy: HOST_COPY, _T.tolist: HOST_COPY, _T.__bool__: BRANCH,
    _T.nonzero: DATA_SHAPE, torch.nonzero: DATA_SHAPE, torch.masked_select: DATA_SHAPE,
    _T.masked_select: DATA_SHAPE, torch.argwhere: DATA_SHAPE,
}


def _on_device(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type != "cpu"


def _bool_index(args: tuple) -> bool:
    index = args[1] if len(args) > 1 else None
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def _to_cpu(args: tuple, kwargs: dict) -> bool:
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    if isinstance(target, (str, torch.device)):
        try:
            return torch.device(target).type == "cpu"
        except RuntimeError:
            return False
    return False


class HostSyncFinder(TorchFunctionMode):
    """Count host synchronisations by (kind, where) while active."""

    def __init__(self, device: torch.device, finder: SiteFinder, counters: Any = None, clock: Any = None) -> None:
        super().__init__()
        self.on_cpu = device.type == "cpu"
        self.finder = finder
        self.counters = counters
        """The phase hooks' ``LoopCounters`` where they run beside: each sync's key goes to ``sync_seen`` (acting or not)."""
        self.clock = clock
        """The phase clock beside it, if any: a sync inside an update call is the update's (``update_syncs``)."""
        self.sites: Counter[tuple[str, str, str | None]] = Counter()
        """Syncs by ``(kind, where, via)``: ``via`` the library the call came through (``frames.where_via``)."""
        self.contexts: dict[tuple[str, str, str | None], str | None] = {}
        """What each site's first sync ran inside (``frames.context_of``): a distribution's class, a buffer's store."""
        self._inside = 0
        self.current: Any = None
        """The user's call being run (outermost), and whether it was counted: a CUDA sync warning raised inside a
        counted call is that same sync (``cuda_sync_warnings`` does not count it twice)."""
        self.current_counted = False

    @property
    def count(self) -> int:
        """Every sync counted."""
        return sum(self.sites.values())

    def _kind(self, func: Any, args: tuple, kwargs: dict) -> str | None:
        tensor = args[0] if args else None
        if not isinstance(tensor, torch.Tensor):
            return None
        kind = _BY_FUNCTION.get(func)
        if kind is None:
            if func is _T.__getitem__ and _bool_index(args):
                kind = DATA_SHAPE
            elif func is _T.cpu and not self.on_cpu:
                kind = HOST_COPY
            elif func is _T.to and _to_cpu(args, kwargs) and not self.on_cpu:
                kind = TO_CPU
            else:
                return None
        if self.on_cpu or _on_device(tensor):
            return kind
        return None

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self._inside == 0:  # torch's own calls made inside a counted one are not the user's
            kind = self._kind(getattr(func, "__wrapped__", func), args, kwargs)  # the phase hooks' wrappers unwrapped
            self.current, self.current_counted = func, kind is not None
            if kind is not None:
                key = (kind, *self.finder.where_via(2))
                self.sites[key] += 1
                if key not in self.contexts:
                    self.contexts[key] = context_of(sys._getframe(1))
                if self.counters is not None:
                    self.counters.sync_seen(key)
                    if self.clock is not None and self.clock.current == "update":
                        self.counters.update_syncs[key] += 1
        self._inside += 1
        try:
            return func(*args, **kwargs)
        finally:
            self._inside -= 1


_COPIES_TO_DEVICE = {_T.to, _T.cuda, _T.copy_, torch.tensor, torch.as_tensor}


def sync_warning_kind(syncs: HostSyncFinder | None) -> str | None:
    """What a CUDA sync warning is, from the user's call it was raised in: None inside a call ``syncs`` already
    counted (the same sync), ``TO_DEVICE`` inside a copy to the device, else ``CUDA_SYNC``."""
    if syncs is not None and syncs._inside and syncs.current_counted:
        return None
    if syncs is not None and syncs._inside and syncs.current in _COPIES_TO_DEVICE:
        return TO_DEVICE
    return CUDA_SYNC


@contextlib.contextmanager
def cuda_sync_warnings(device: torch.device, finder: SiteFinder, sites: Counter,
                       syncs: HostSyncFinder | None = None) -> Iterator[None]:
    """On CUDA: ``set_sync_debug_mode("warn")``, each warning counted at its user line; elsewhere nothing.

    With ``syncs`` (the host-sync finder running inside): a warning raised by a call it already counted
    (``bool(t)``, ``.item()``, ``.cpu()``) is not counted again, and one raised by a copy to the device (a pageable
    host tensor's ``.to(device)``) is counted as ``TO_DEVICE``."""
    if device.type != "cuda" or not torch.cuda.is_available():
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    original_show = warnings.showwarning

    def show(message: Any, category: type, filename: str, lineno: int, *rest: Any) -> None:
        if "synchroniz" in str(message):
            kind = sync_warning_kind(syncs)
            if kind is not None:
                sites[(kind, *finder.where_via(2))] += 1
        else:
            original_show(message, category, filename, lineno, *rest)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)
            warnings.showwarning = original_show


OPTIMIZER, DISTRIBUTION_CHECKS, PER_ENV_ACTING, ACTION_COPY, DATA_DEPENDENT, LOGGING, STORAGE, LIBRARY_CONTROL, \
    BLOCKING_TRANSFER = (
        "optimizer step", "distribution argument checks", "per-env acting", "action copy", "data-dependent shape",
        "logging/statistics", "per-step copy into a buffer", "library done/reset handling and bookkeeping",
        "blocking host-to-device copy")
"""What each sync is for (``causes``): each points to its own fix (``recommendations``)."""


def per_env_step(sites: Counter, env_steps: int, acting: Counter | None = None,
                 envs_per_step: float = 1.0, contexts: dict | None = None,
                 updating: Counter | None = None) -> list[dict[str, Any]]:
    """``[{where, kind, count, per_env_step, via, context, cause}]``, most frequent first (``cause``: ``cause_of``;
    ``context``: ``frames.context_of``)."""
    steps = max(1, env_steps)
    rows = []
    for key, count in sorted(sites.items(), key=lambda item: -item[1]):
        kind, where, via = key
        acting_share = (acting or Counter())[key] / count
        context = (contexts or {}).get(key)
        update_share = (updating or Counter())[key] / count
        rows.append({"where": where, "kind": kind, "count": count, "per_env_step": count / steps, "via": via,
                     "context": context,
                     "cause": cause_of(kind, via, acting_share, count / steps * envs_per_step, context, where,
                                       update_share)})
    return rows


def cause_of(kind: str, via: str | None, acting_share: float, per_vector_step: float, context: str | None = None,
             where: str = "", update_share: float = 0.0) -> str:
    """A sync's cause: made inside an optimizer's step (its own per-parameter step counters: the for-loop
    implementation), inside ``torch.distributions`` (argument validation), a host copy inside a buffer's store
    method (rollout/replay storage filled a step at a time), inside an RL library's own code (its done/reset
    handling and bookkeeping, its ``.item()`` in an update aside: statistics; a host copy once per vector step there
    is the env's action copy), while acting (more than one per
    vector step: actions taken env by env; one: the action copy an env step needs), a data-dependent shape,
    or else statistics and logging."""
    if kind == TO_DEVICE:
        return BLOCKING_TRANSFER
    if via == "torch.optim":
        return OPTIMIZER
    if via == "torch.distributions":
        return DISTRIBUTION_CHECKS
    if context and context.startswith("storage:") and kind in (HOST_COPY, TO_CPU, ITEM):
        return STORAGE
    if library_of(where) and not (kind == ITEM and update_share > 0.5):  # (a library's training statistics: logging)
        return ACTION_COPY if kind in (HOST_COPY, TO_CPU) and per_vector_step <= 1.5 else LIBRARY_CONTROL
    if acting_share > 0.5:
        return PER_ENV_ACTING if per_vector_step > 1.5 else ACTION_COPY
    return DATA_DEPENDENT if kind == DATA_SHAPE else LOGGING
