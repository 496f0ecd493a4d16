"""float64/complex128 work with its source lines: the MPS audit done for the user.

The counting is ``harness.measurement.sentinels.Float64Sentinel``'s (the same rule as the
stability check of ``run`` and ``gate``): each distinct op at each user ``file:line``, counted.
"""

from __future__ import annotations

from typing import Any

from harness.measurement.sentinels import Float64Sentinel


def float64_finder(own_code_is_rlgauge: bool) -> Float64Sentinel:
    """A sentinel whose sites skip rlgauge's frames unless the trainer is rlgauge's own."""
    return Float64Sentinel(own_code_is_rlgauge=own_code_is_rlgauge)


def float64_sites(sentinel: Float64Sentinel) -> list[dict[str, Any]]:
    """``[{where, op, count, call}]`` in the order first seen (the first is where float64 entered); ``call`` names
    the call on the line that made them (``torch.as_tensor(reward)``), or None where the call is the line."""
    calls = getattr(getattr(sentinel, "_finder", None), "calls", {})
    return [{"where": where, "op": op.removeprefix("aten.").removesuffix(".default"), "count": count,
             "call": _one_call(calls.get(where))} for (op, where), count in sentinel.sites.items()]


def _one_call(calls: Any) -> str | None:
    """The call that made the float64 ops at a site, where the line has another call besides (the most
    frequent one where several did)."""
    return calls.most_common(1)[0][0] if calls else None
