"""The side-by-side table: paired ratios and which rows carry one."""

from __future__ import annotations

from rich.console import Console

from harness.report.tables import paired_ratio, results_table
from harness.results import RunResult


def _result(variant: str, rates: list[float], ret: float) -> RunResult:
    rate = {"median": sorted(rates)[len(rates) // 2], "min": min(rates), "max": max(rates), "samples": rates}
    metrics = {
        "env_steps_per_sec": rate, "agent_steps_per_sec": rate, "updates_per_sec": rate,
        "inference_latency_ms": {"p50": 1.0, "p95": 2.0},
        "phase_seconds": {"env": 1.0, "inference": 1.0, "update": 2.0, "transfer": 0.0, "logging": 0.0},
        "peak_host_rss_mb": 100.0, "peak_device_mem_mb": None, "device_utilization_pct": 100.0,
        "host_syncs_per_step": 4.0, "warmup_s": 1.0, "mean_return_last_k": ret,
    }
    return RunResult("ppo-cartpole", variant, "ppo", "ok", "2026-01-01T00:00:00+00:00", {"commit": None, "dirty": False},
                     {}, {"device": "cpu"}, metrics, {"float64_ops": 0, "nonfinite_events": 0,
                                                      "compile_fallback": False, "passed": True})


def test_paired_ratio_pairs_repeats_in_order() -> None:
    base = {"samples": [100.0, 200.0, 100.0]}
    cand = {"samples": [300.0, 400.0, 500.0]}
    assert paired_ratio(base, cand) == (3.0, 2.0, 5.0)


def test_table_shows_rate_ratio_but_no_ratio_for_returns() -> None:
    table = results_table([_result("baseline", [100.0, 110.0, 90.0], -200.0),
                           _result("optimized", [300.0, 330.0, 270.0], -100.0)])
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    rate_line = next(line for line in text.splitlines() if "env_steps_per_sec" in line)
    assert "3.00x [3.00-3.00]" in rate_line and "[min-max]" in rate_line
    return_line = next(line for line in text.splitlines() if "mean_return_last_k" in line)
    assert "x" not in return_line.split("│")[-2]
