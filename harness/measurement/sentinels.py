"""Detectors that watch the training path: float64 ops and device->host synchronisations.

Both are used for one check iteration after the timed loop (never inside it, so they do
not distort the throughput they sit beside). A ``TorchDispatchMode`` cannot run inside
compiled code, so that iteration runs under ``torch.compiler.set_stance("force_eager")``: the
float64 check covers the eager execution of compiled functions.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections import Counter
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_WIDE = (torch.float64, torch.complex128)
_TORCH_DIR = os.path.dirname(torch.__file__)


class Float64Sentinel(TorchDispatchMode):
    """Count every dispatched op with a float64/complex128 input or output, with where it came from."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.ops: Counter[str] = Counter()
        self.first_site: str | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        tensors = [x for x in tree_flatten((args, kwargs, out))[0] if isinstance(x, torch.Tensor)]
        if any(t.dtype in _WIDE for t in tensors):
            self.count += 1
            self.ops[str(func)] += 1
            if self.first_site is None:
                frames = [f for f in traceback.extract_stack()[:-1] if not f.filename.startswith(_TORCH_DIR)]
                self.first_site = f"{func} at {frames[-1].filename}:{frames[-1].lineno}" if frames else str(func)
        return out


_SYNC_METHODS_ANY = ("item", "tolist", "__float__", "__int__", "__bool__")


class HostSyncCounter:
    """Count device->host synchronisations while active.

    On an accelerator: ``.item()``, ``.tolist()``, ``float()/int()/bool()``, ``.cpu()`` and
    ``.to('cpu')`` of a device tensor. On the CPU nothing synchronises, so the calls the
    training code makes (not torch's own, e.g. optimiser step counters, which live on the
    host on every device) are counted as they would on an accelerator; ``.cpu()`` of a CPU
    tensor is free there, so only its ``.numpy()`` counts, once.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.count = 0
        self.by_call: Counter[str] = Counter()

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        counter, on_cpu = self, self.device.type == "cpu"

        def wrapped(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if on_cpu and sys._getframe(1).f_code.co_filename.startswith(_TORCH_DIR):
                return original(tensor, *args, **kwargs)
            if _counts(name, tensor, args, kwargs, on_cpu):
                counter.count += 1
                counter.by_call[name] += 1
            return original(tensor, *args, **kwargs)

        return wrapped

    @contextlib.contextmanager
    def active(self) -> Iterator["HostSyncCounter"]:
        names = _SYNC_METHODS_ANY + ("cpu", "to", "numpy")
        originals = {n: getattr(torch.Tensor, n) for n in names}
        own = {n for n in names if n in vars(torch.Tensor)}  # the rest are inherited from the C base
        try:
            for name, original in originals.items():
                setattr(torch.Tensor, name, self._wrap(name, original))
            yield self
        finally:
            for name, original in originals.items():
                if name in own:
                    setattr(torch.Tensor, name, original)
                else:
                    delattr(torch.Tensor, name)


def _counts(name: str, tensor: torch.Tensor, args: tuple, kwargs: dict, on_cpu: bool) -> bool:
    if on_cpu:
        return name in _SYNC_METHODS_ANY or name == "numpy"
    if tensor.device.type == "cpu":
        return False
    if name in _SYNC_METHODS_ANY:
        return True
    if name == "cpu":
        return True
    if name == "to":
        target = kwargs.get("device", args[0] if args else None)
        return isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu"
    return False
