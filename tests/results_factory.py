"""Hand-made RunResults and result files with chosen per-repeat samples (for compare / gate / record tests)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from harness.results import RunResult, save_results

PHASES = {"env": 0.1, "inference": 0.1, "update": 0.1, "transfer": 0.0, "logging": 0.0}


def rate_block(samples: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "samples": list(samples)}


def machine_state(others: list[float] | None = None, *, load: tuple[float, float] = (0.5, 0.75), intra_op: int = 2,
                  capped_from: int | None = None, omp: str | None = None) -> dict[str, Any]:
    """A ``machine_state`` block as the runner writes it; ``others``: other processes' CPU share per segment."""
    shares = [0.02, 0.03, 0.04] if others is None else others
    return {"cpu_count": 2, "usable_cores": 2, "affinity": [0, 1],
            "load_avg_before": [load[0], 0.4, 0.3], "load_avg_after": [load[1], 0.5, 0.3], "busy_cores_before": 0.1,
            "others_cpu_share": rate_block(shares) if shares else None,
            "threads": {"intra_op": intra_op, "inter_op": 1, "capped_from": capped_from},
            "thread_env": {"OMP_NUM_THREADS": omp, "MKL_NUM_THREADS": None, "OPENBLAS_NUM_THREADS": None}}


def make_result(variant: str = "optimized", samples: list[float] | None = None, *, preset: str = "ppo-cartpole",
                status: str = "ok", float64_ops: int = 0, nonfinite_events: int = 0, compile_fallback: bool = False,
                mean_return: float | None = 30.0, warmup_steps: int = 1024, steps_completed: int = 12288,
                commit: str | None = "0123456789abcdef", dirty: bool = False, device: str = "cpu",
                error: str | None = None, latency_p50: float = 0.25, cpu_samples: list[float] | None = None,
                state: dict[str, Any] | None = None, untrustworthy: list[str] | None = None,
                old: bool = False) -> RunResult:
    """A run with chosen samples. ``cpu_samples``: CPU seconds per 1k env steps (default: 1000 / rate);
    ``state``: its machine_state (default: a quiet machine); ``untrustworthy``: the reasons of a run judged
    not trustworthy; ``old``: a run from before machine_state, quality and CPU seconds were recorded."""
    samples = [1000.0, 1010.0, 990.0] if samples is None else samples
    measured = bool(samples)
    passed = status == "ok" and not float64_ops and not nonfinite_events
    cpu = [1000.0 / s for s in samples] if cpu_samples is None else cpu_samples
    quality = None if old or not measured else {"trustworthy": not untrustworthy, "reasons": list(untrustworthy or [])}
    steps = min(4096, max(1, steps_completed // max(1, len(samples))))  # repeats x steps <= steps_completed, as run
    run = RunResult(
        preset=preset, variant=variant, algo="ppo", status=status, started_at="2026-01-02T03:04:05+00:00",
        git={"commit": commit, "dirty": dirty},
        machine={"cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "torch": "2.13.0+cpu", "device": device,
                 "device_name": "x86_64"},
        config={"device": device, "seed": 1, "env": {"id": "CartPole-v1", "num_envs": 16},
                "run": {"warmup_steps": warmup_steps, "steps": steps, "repeats": len(samples)}},
        metrics={
            "env_steps_per_sec": rate_block(samples) if measured else None,
            "agent_steps_per_sec": rate_block(samples) if measured else None,
            "updates_per_sec": rate_block([s / 256 for s in samples]) if measured else None,
            "inference_latency_ms": {"p50": latency_p50, "p95": latency_p50 * 2},
            "phase_seconds": dict(PHASES), "peak_host_rss_mb": 300.0, "peak_device_mem_mb": None,
            "device_utilization_pct": 99.0, "host_syncs_per_step": 1.0, "warmup_s": 0.5,
            "mean_return_last_k": mean_return,
        },
        stability={"float64_ops": float64_ops, "nonfinite_events": nonfinite_events,
                   "compile_fallback": compile_fallback, "passed": passed},
        steps_completed=steps_completed, error=error,
        machine_state={} if old else (machine_state() if state is None else state), quality=quality,
    )
    if not old:
        run.metrics["cpu_seconds_per_1k_env_steps"] = rate_block(cpu) if measured and cpu else None
    return run


def write_results(path: Path, *runs: RunResult) -> Path:
    save_results(path, list(runs))
    return path
