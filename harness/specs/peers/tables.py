"""Terminal tables for a peer run: the hyper-parameter matching and the side-by-side throughput."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from harness.stats.compare import paired_ratio
from harness.results import RunResult


def matching_table(peer: str, rows: list[Any]) -> Table:
    """Our key and value beside the peer's argument and value (``rows``: the adapter's ``Match`` rows)."""
    table = Table(title=f"hyper-parameters matched with {peer}")
    for column in ("our key", "our value", f"{peer} argument", f"{peer} value", "note"):
        table.add_column(column)
    for m in rows:
        table.add_row(*(escape(str(v)) for v in (m.ours, m.our_value, m.sb3, m.sb3_value, m.note)))
    return table


def _rate(run: RunResult) -> str:
    rate = run.metrics.get("env_steps_per_sec") if run.status == "ok" else None
    return run.status if not rate else f"{rate['median']:,.0f} [{rate['min']:,.0f}-{rate['max']:,.0f}]"


def peer_table(results: list[RunResult], peer: str) -> Table:
    """Each run's env steps/sec and its ratio to the peer (median of paired per-repeat ratios, 95% bootstrap)."""
    ref = next(r for r in results if r.variant == peer)
    table = Table(title=f"{ref.preset}: ours vs {peer}, interleaved in one process on {ref.config['device']}")
    for column, justify in (("run", "left"), ("env_steps_per_sec median [min-max]", "right"),
                            (f"ratio to {peer} (paired median [95% CI])", "right"),
                            ("end-to-end ratio (start-up, build, warm-up, timed)", "right"),
                            ("mean_return_last_k", "right")):
        table.add_column(column, justify=justify)
    ref_rate = ref.metrics.get("env_steps_per_sec") if ref.status == "ok" else None
    for run in results:
        rate = run.metrics.get("env_steps_per_sec") if run.status == "ok" else None
        ratio = paired_ratio(ref_rate["samples"], rate["samples"]).fmt() if rate and ref_rate else "-"
        ret = run.metrics.get("mean_return_last_k")
        name = f"{peer}" if run is ref else f"ours {run.variant}"
        ends = run.metrics.get("end_to_end_env_steps_per_sec"), ref.metrics.get("end_to_end_env_steps_per_sec")
        end_ratio = f"{ends[0] / ends[1]:.2f}x" if all(ends) else "-"
        table.add_row(escape(name), escape(_rate(run)), escape(ratio), end_ratio, "-" if ret is None else f"{ret:.1f}")
    return table
