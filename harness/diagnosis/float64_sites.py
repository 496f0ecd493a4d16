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
    """``[{where, op, count}]`` in the order first seen (the first is where float64 entered)."""
    return [{"where": where, "op": op.removeprefix("aten.").removesuffix(".default"), "count": count}
            for (op, where), count in sentinel.sites.items()]
