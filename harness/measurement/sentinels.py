"""The float64 sentinel that watches the training path (device->host synchronisations are counted by
``harness.diagnosis.host_syncs``, the one counter of ``run`` and ``diagnose``).

Both are used for one check iteration after the timed loop (never inside it, so they do
not distort the throughput they sit beside). A ``TorchDispatchMode`` cannot run inside
compiled code, so that iteration runs under ``torch.compiler.set_stance("force_eager")``: the
float64 check covers the eager execution of compiled functions.
"""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_WIDE = (torch.float64, torch.complex128)
_LIFT = "aten.lift_fresh.default"
_CAST = "aten._to_copy.default"


class Float64Sentinel(TorchDispatchMode):
    """Count float64/complex128 *work*: every dispatched op with a float64/complex128 input or output,
    with the user's ``file:line`` it came from (``sites``: (op, where) -> count).

    Not counted: host data converted into a narrower tensor at creation, i.e. ``torch.tensor(x,
    dtype=torch.float32)`` / ``torch.as_tensor(x, dtype=torch.float32)`` / ``torch.from_numpy(x).float()``
    of float64 NumPy data (dispatched as ``lift_fresh`` of the host data, then ``_to_copy`` to float32).
    Counted: a float64 tensor that is created and kept (``torch.tensor(reward)`` of float64
    rewards, ``torch.as_tensor(np_float64)``: what MPS cannot hold) and any op computing in float64.
    """

    def __init__(self, own_code_is_rlgauge: bool = True) -> None:
        super().__init__()
        # torch.optim imports torch._dynamo on a first step: imported here, not under the mode
        import torch._dynamo  # noqa: F401

        from harness.diagnosis.frames import SiteFinder

        self.count = 0
        self.ops: Counter[str] = Counter()
        self.sites: Counter[tuple[str, str]] = Counter()
        self.first_site: str | None = None
        self._finder = SiteFinder(own_code_is_rlgauge)
        self._pending: dict[int, tuple[Any, str]] = {}
        """Float64 tensors lifted from host data and not yet converted: id -> (weak ref, where)."""

    def _count(self, op: str, where: str) -> None:
        self.count += 1
        self.ops[op] += 1
        self.sites[(op, where)] += 1
        if self.first_site is None:
            self.first_site = f"{op} at {where}"

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(func)
        inputs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        outputs = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
        if name == _LIFT and outputs and outputs[0].dtype in _WIDE and outputs[0].device.type == "cpu":
            self._pending[id(outputs[0])] = (weakref.ref(outputs[0]), self._finder.where(2))
            return out
        lifted = [self._pending.pop(id(t)) for t in inputs if id(t) in self._pending
                  and self._pending[id(t)][0]() is t]
        if lifted and name == _CAST and outputs and all(t.dtype not in _WIDE for t in outputs):
            return out  # host float64 data converted at creation: no float64 tensor is kept
        for _, where in lifted:
            self._count(_LIFT, where)
        if any(t.dtype in _WIDE for t in inputs + outputs):
            self._count(name, self._finder.where(2))
        return out

    def __exit__(self, *exc: Any) -> Any:
        for _, where in self._pending.values():  # created from float64 host data and kept as float64
            self._count(_LIFT, where)
        self._pending.clear()
        return super().__exit__(*exc)


_FLOAT32_HINT = "make it float32 there (dtype=torch.float32 where the tensor is made, or .astype(np.float32))"
_NONFINITE_HINT = ("a loss or gradient went NaN/inf: look for log(0), a division by zero or an exploding "
                   "update (a lower learning rate, or clipping gradients, keeps it finite)")


def float64_hint(site: str) -> str:
    """Where float64 enters and what to change there, from a sentinel's first site (``OP at FILE:LINE``)."""
    op, sep, where = site.partition(" at ")
    if not sep:
        return f"first: {site}"
    change = ("make it float32 there (drop the .double() / .to(torch.float64), or cast with .float())"
              if op == _CAST else _FLOAT32_HINT)
    return f"float64 enters at {where} ({op}): {change}"


def instability(stability: dict[str, Any]) -> str:
    """One line: what made a run unstable, where (the first float64 op's ``file:line``) and what to change."""
    parts = []
    if stability.get("float64_ops"):
        site = stability.get("float64_first_site")
        parts.append(f"float64_ops={stability['float64_ops']}" + (f": {float64_hint(site)}" if site else ""))
    if stability.get("nonfinite_events"):
        site = stability.get("nonfinite_first_site")
        parts.append(f"nonfinite_events={stability['nonfinite_events']}" + (f", first: {site}" if site else "")
                     + f": {_NONFINITE_HINT}")
    if stability.get("sentinel_skipped"):
        parts.append(stability["sentinel_skipped"])
    return "; ".join(parts) or f"float64_ops={stability.get('float64_ops')} nonfinite_events=" \
        f"{stability.get('nonfinite_events')}"


