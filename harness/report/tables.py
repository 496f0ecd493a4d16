"""Tables for the terminal: one run's metrics, or variants side by side with ratios."""

from __future__ import annotations

import statistics
from typing import Any, Callable

from rich.markup import escape
from rich.table import Table

from reference_trainers.runtime.probe import PHASES

from harness.results import RunResult

def _fmt_rate(block: dict[str, Any] | None) -> str:
    if block is None:
        return "-"
    return f"{block['median']:,.0f} [{block['min']:,.0f}-{block['max']:,.0f}]"


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _fmt_cpu(block: dict[str, Any] | None) -> str:
    if block is None:
        return "-"
    return f"{block['median']:.3f} [{block['min']:.3f}-{block['max']:.3f}]"


def _fmt_machine(result: RunResult) -> str:
    """Other processes' median CPU share during the timed segments, and the threads used."""
    state = result.machine_state or {}
    share, threads = (state.get("others_cpu_share") or {}).get("median"), state.get("threads") or {}
    if share is None:
        return "-"
    capped = f" (capped from {threads['capped_from']})" if threads.get("capped_from") else ""
    return f"{share:.0%} busy elsewhere; threads {threads.get('intra_op')}/{threads.get('inter_op')}{capped}"


def _fmt_cache(value: dict[str, int] | None) -> str:
    if not value:
        return "-"
    bypass = f" ({value['bypass']} bypassed)" if value.get("bypass") else ""
    return f"{value.get('hit', 0)} / {value.get('miss', 0)}{bypass}"


ROWS: list[tuple[str, Callable[[RunResult], Any], Callable[[Any], str], bool]] = [
    # label, value, formatter, whether a ratio means something (shown as second / first)
    ("env_steps_per_sec (median [min-max])", lambda r: r.metrics["env_steps_per_sec"], _fmt_rate, True),
    ("agent_steps_per_sec", lambda r: r.metrics["agent_steps_per_sec"], _fmt_rate, True),
    ("cpu_seconds_per_1k_env_steps", lambda r: r.metrics.get("cpu_seconds_per_1k_env_steps"), _fmt_cpu, True),
    ("updates_per_sec", lambda r: r.metrics["updates_per_sec"], _fmt_rate, True),
    ("inference_latency_ms p50", lambda r: (r.metrics["inference_latency_ms"] or {}).get("p50"), lambda v: _fmt(v, 3), True),
    ("inference_latency_ms p95", lambda r: (r.metrics["inference_latency_ms"] or {}).get("p95"), lambda v: _fmt(v, 3), True),
    ("host_syncs_per_step", lambda r: r.metrics["host_syncs_per_step"], _fmt, True),
    ("peak_host_rss_mb", lambda r: r.metrics["peak_host_rss_mb"], lambda v: _fmt(v, 0), True),
    ("peak_device_mem_mb", lambda r: r.metrics["peak_device_mem_mb"], lambda v: _fmt(v, 0), True),
    ("device_utilization_pct", lambda r: r.metrics["device_utilization_pct"], lambda v: _fmt(v, 0), True),
    ("gpu_utilization_pct (NVML, mean)", lambda r: r.metrics.get("gpu_utilization_pct"), lambda v: _fmt(v, 0), True),
    ("gpu_peak_memory_mb (NVML, all processes)", lambda r: r.metrics.get("gpu_peak_memory_mb"), lambda v: _fmt(v, 0),
     True),
    ("warmup_s", lambda r: r.metrics["warmup_s"], _fmt, True),
    ("end_to_end_env_steps_per_sec", lambda r: r.metrics.get("end_to_end_env_steps_per_sec"), lambda v: _fmt(v, 0),
     True),
    ("end_to_end_s", lambda r: r.metrics.get("end_to_end_s"), _fmt, True),
    ("compiled graphs: inductor cache hit / miss", lambda r: r.metrics.get("inductor_cache"), _fmt_cache, False),
    ("mean_return_last_k", lambda r: r.metrics["mean_return_last_k"], lambda v: _fmt(v, 1), False),
]


SHOWN_IF_RECORDED = {"gpu_utilization_pct (NVML, mean)", "gpu_peak_memory_mb (NVML, all processes)",
                     "compiled graphs: inductor cache hit / miss"}
"""Rows left out when no run has a value (NVML's readings exist for CUDA runs only; cache lookups
where something compiled)."""


def _phase_share(result: RunResult, phase: str) -> float | None:
    phases = result.metrics.get("phase_seconds") or {}
    total = sum(phases.values())
    return 100.0 * phases.get(phase, 0.0) / total if total else None


def _fmt_quality(result: RunResult) -> str:
    if result.quality is None:
        return "-"
    count = len(result.quality["reasons"])
    return "yes" if result.quality["trustworthy"] else f"NO ({count} reason{'s' * (count != 1)} below)"


def paired_ratio(base: dict[str, Any] | None, cand: dict[str, Any] | None) -> tuple[float, float, float] | None:
    """Ratio of rates repeat by repeat (the repeats were interleaved): median, min, max."""
    if not base or not cand:
        return None
    pairs = [c / b for b, c in zip(base["samples"], cand["samples"]) if b > 0]
    if not pairs:
        return None
    return statistics.median(pairs), min(pairs), max(pairs)


def _ratio_cell(label: str, base: RunResult, cand: RunResult, value: Callable[[RunResult], Any]) -> str:
    b, c = value(base), value(cand)
    if isinstance(b, dict) and isinstance(c, dict):
        ratio = paired_ratio(b, c)
        return "-" if ratio is None else f"{ratio[0]:.2f}x [{ratio[1]:.2f}-{ratio[2]:.2f}]"
    if isinstance(b, (int, float)) and isinstance(c, (int, float)) and b:
        return f"{c / b:.2f}x"
    return "-"


def results_table(results: list[RunResult]) -> Table:
    """Metric rows, one column per run; with two runs, a ratio column (second / first)."""
    devices = list(dict.fromkeys(str(r.config["device"]) for r in results))  # several: a device comparison
    table = Table(title=f"{results[0].preset}: " + " vs ".join(r.variant for r in results) + f" on {', '.join(devices)}")
    table.add_column("metric")
    for result in results:
        table.add_column(result.variant + ("" if result.status == "ok" else f" ({result.status})"), justify="right")
    pair = len(results) == 2
    if pair:
        table.add_column(f"ratio {results[1].variant}/{results[0].variant}", justify="right")
    for label, value, fmt, has_ratio in ROWS:
        if label in SHOWN_IF_RECORDED and all(value(r) is None for r in results):
            continue
        cells = [fmt(value(r)) for r in results]
        if pair:
            cells.append(_ratio_cell(label, results[0], results[1], value) if has_ratio else "")
        table.add_row(escape(label), *(escape(c) for c in cells))
    for phase in PHASES:
        cells = [_fmt(_phase_share(r, phase), 1) for r in results]
        table.add_row(f"phase {phase} (% of timed)", *cells, *([""] if pair else []))
    table.add_row("machine (others' CPU; intra/inter threads)", *[escape(_fmt_machine(r)) for r in results],
                  *([""] if pair else []))
    table.add_row("trustworthy", *[_fmt_quality(r) for r in results], *([""] if pair else []))
    table.add_row("float64_ops / nonfinite_events", *[f"{r.stability['float64_ops']} / {r.stability['nonfinite_events']}" for r in results],
                  *([""] if pair else []))
    return table
