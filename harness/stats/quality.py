"""Whether a run's figures can be trusted: the quality verdict every result carries.

A run is not trustworthy when the machine was not its own while it was timed, or when its
repeats disagree by more than a ratio of medians can absorb:

- other processes took more than ``OTHERS_SHARE_LIMIT`` of its usable cores (median over
  its timed segments): wall-time rates then depend on the neighbour, not on the code;
- its intra-op threads outnumber the cores the others left free (threads that spin against
  a neighbour multiply a slowdown);
- its slowest and fastest repeats are more than ``REPEAT_SPREAD_LIMIT`` times apart.

The verdict is ``{"trustworthy": bool, "reasons": [one line each]}``; ``run`` prints each
reason as a warning after its table, ``compare`` and the reports show them, and ``gate``
refuses to decide on an untrustworthy run unless told to.
"""

from __future__ import annotations

import statistics
from typing import Any

OTHERS_SHARE_LIMIT = 0.10
"""Median share of the usable cores other processes may take during the timed segments."""
REPEAT_SPREAD_LIMIT = 2.0
"""Largest accepted ratio of the fastest to the slowest repeat."""


def assess(machine_state: dict[str, Any], env_rates: list[float]) -> dict[str, Any]:
    """The quality verdict of one run from its ``machine_state`` block and per-repeat rates."""
    reasons: list[str] = []
    shares = (machine_state.get("others_cpu_share") or {}).get("samples") or []
    cores = int(machine_state.get("usable_cores") or 1)
    if shares:
        median, peak = statistics.median(shares), max(shares)
        if median > OTHERS_SHARE_LIMIT:
            reasons.append(f"other processes took {median:.0%} of the {cores} usable cores during the timed "
                           f"segments (median; up to {peak:.0%}): wall-time rates depend on them")
        free = max(1.0, cores * (1.0 - median))
        threads = int((machine_state.get("threads") or {}).get("intra_op") or 1)
        if threads > round(free) and median > OTHERS_SHARE_LIMIT / 2:
            reasons.append(f"{threads} intra-op threads on {cores} cores while other processes kept "
                           f"{cores * median:.1f} busy: its threads oversubscribe the cores left free")
    if len(env_rates) >= 2 and min(env_rates) > 0:
        spread = max(env_rates) / min(env_rates)
        if spread > REPEAT_SPREAD_LIMIT:
            reasons.append(f"repeats disagree: {min(env_rates):,.0f} to {max(env_rates):,.0f} env steps/s "
                           f"({spread:.1f}x apart, more than {REPEAT_SPREAD_LIMIT:g}x)")
    return {"trustworthy": not reasons, "reasons": reasons}
