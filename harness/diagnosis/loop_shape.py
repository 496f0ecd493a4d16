"""The shape of a training loop: forwards and kernels per env step, the optimizer's
implementation, torch threads, and compile graph breaks and recompiles.

Kernels are the ops torch dispatches to a backend (``TorchDispatchMode``), each a kernel
launch on an accelerator: their count per env step is what launch overhead scales with.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_FREE = ("aten.detach", "aten.view", "aten._unsafe_view", "aten.t.", "aten.alias", "aten.lift_fresh",
         "aten.expand", "aten.unsqueeze", "aten.squeeze", "aten.permute", "aten.transpose", "aten.slice",
         "aten.select", "aten.as_strided", "aten.reshape")
"""Ops that only make views (metadata): no kernel runs."""


class KernelCounter(TorchDispatchMode):
    """Count dispatched ops that run a kernel (views aside)."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if not is_free(func):
            self.kernels += 1
        return func(*args, **(kwargs or {}))


def is_free(func: Any) -> bool:
    """An op that only makes a view (no kernel runs)."""
    return str(func).startswith(_FREE)


def optimizer_impl(optimizer: torch.optim.Optimizer) -> str:
    """``fused``, ``foreach`` or ``for-loop``: the implementation its step takes."""
    defaults = optimizer.defaults
    if defaults.get("fused"):
        return "fused"
    foreach = defaults.get("foreach")
    if foreach is None and "foreach" in defaults:  # torch picks foreach by default on CUDA tensors only
        params = [p for group in optimizer.param_groups for p in group["params"]]
        foreach = bool(params) and all(p.device.type == "cuda" for p in params)
    return "foreach" if foreach else "for-loop"


def optimizers(found: dict[int, torch.optim.Optimizer], compiled: set[int] | None = None,
               eager: set[int] | None = None) -> list[dict[str, str]]:
    """``[{class, impl}]`` of the optimizers that stepped; ``impl`` is ``compiled`` for one stepped only inside
    compiled code (no eager step seen): its step is whatever the compiler made of it, not the for-loop."""
    compiled = compiled or set()
    return [{"class": type(o).__name__,
             "impl": "compiled" if key in compiled and key not in (eager or set()) else optimizer_impl(o)}
            for key, o in found.items()]


def compile_counters() -> dict[str, int]:
    """torch.compile's graph breaks and frames compiled so far in this process (0 where nothing compiled).

    A frame compiled after the warm-up is a recompile: the diagnosis reports the difference
    between its counters before and after the diagnosed iterations as ``recompiles``.
    """
    from torch._dynamo.utils import counters

    return {"graph_breaks": int(sum(counters["graph_break"].values())),
            "frames_compiled": int(counters["frames"].get("ok", 0))}
