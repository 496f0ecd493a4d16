"""asv benchmarks of a trainer in a few lines of a user's ``benchmarks/`` folder::

    from harness.integrations.asv_helpers import trainer_benchmarks

    MyTrainerSpeed = trainer_benchmarks("bench.yaml", name="MyTrainerSpeed")

The class runs the target's variants once per asv process (``setup_cache``: interleaved, as
``rlgauge run`` does) and reports, per variant, ``track_env_steps_per_sec`` (higher is better)
with its lower-is-better twin ``track_seconds_per_1k_env_steps`` (what ``asv continuous``
should gate on), ``track_cpu_seconds_per_1k_env_steps``, ``track_peak_host_rss_mb`` and, where
the trainer has a policy rlgauge can call, ``track_inference_latency_ms``. The target is a
preset, a trainer file (``trainer: MODULE:FACTORY``), or ``trainer=`` with ``config=``.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

TRACKED = ("env_steps_per_sec", "seconds_per_1k_env_steps", "cpu_seconds_per_1k_env_steps", "peak_host_rss_mb",
           "inference_latency_ms")


_MADE: dict[str, str] = {}
"""Module -> the class ``trainer_benchmarks`` made there."""


def _target_file(trainer: str, config: dict[str, Any] | None) -> str:
    import yaml

    handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="rlgauge-asv-", delete=False)
    with handle:
        yaml.safe_dump({"trainer": trainer, **(config or {})}, handle, sort_keys=False)
    return handle.name


def measure_variants(target: str, variants: list[str] | None, overrides: list[str]) -> dict[str, dict[str, float]]:
    """Run the target's variants interleaved once; ``{variant: {tracked metric: value}}`` (NaN where
    a metric was not measured, e.g. latency of a user's trainer)."""
    from harness.specs.presets import specs_for
    from harness.measurement.runner import run_variants

    specs = specs_for(target, "both", overrides)
    if variants:
        specs = [spec for spec in specs if spec.variant in variants]
    results, interrupted = run_variants(specs, say=lambda _text: None)
    if interrupted:
        raise KeyboardInterrupt
    out: dict[str, dict[str, float]] = {}
    for result in results:
        m = result.metrics
        rate = (m.get("env_steps_per_sec") or {}).get("median", math.nan) if result.status == "ok" else math.nan
        cpu = (m.get("cpu_seconds_per_1k_env_steps") or {}).get("median", math.nan)
        latency = (m.get("inference_latency_ms") or {}).get("p50", math.nan)
        out[result.variant] = {"env_steps_per_sec": rate, "seconds_per_1k_env_steps": 1000.0 / rate if rate else math.nan,
                               "cpu_seconds_per_1k_env_steps": cpu, "peak_host_rss_mb": m.get("peak_host_rss_mb", math.nan),
                               "inference_latency_ms": latency}
    return out


def _tracker(metric: str, unit: str) -> Callable[..., float]:
    def track(self: Any, cache: dict[str, dict[str, float]], variant: str) -> float:
        return cache[variant][metric]

    track.__name__ = f"track_{metric}"
    track.unit = unit  # type: ignore[attr-defined]
    return track


def trainer_benchmarks(target: str | Path | None = None, *, name: str = "TrainerSpeed", trainer: str | None = None,
                       config: dict[str, Any] | None = None, variants: tuple[str, ...] = ("baseline", "optimized"),
                       steps: int = 4096, warmup_steps: int = 1024, repeats: int = 3,
                       sets: tuple[str, ...] = (), timeout: float = 600) -> type:
    """An asv benchmark class (module docstring) named ``name``, parametrised over ``variants``."""
    if (target is None) == (trainer is None):
        raise ValueError("trainer_benchmarks: give a preset or FILE.yaml, or trainer='MODULE:FACTORY' (one of them)")
    overrides = [f"run.steps={steps}", f"run.warmup_steps={warmup_steps}", f"run.repeats={repeats}", *sets]
    source = str(target) if target is not None else None

    def setup_cache(self: Any) -> dict[str, dict[str, float]]:
        file = source if source is not None else _target_file(str(trainer), config)
        return measure_variants(file, list(variants), overrides)

    # asv keys setup_cache by its function's module and line: the caller's module makes the key that
    # module's own, and one class per module keeps it unique (a second would share the first's cache)
    module = sys._getframe(1).f_globals.get("__name__", __name__)
    if module in _MADE and _MADE[module] != name:
        raise ValueError(f"trainer_benchmarks: {module} already has {_MADE[module]}; asv would give {name} the same "
                         "setup cache: make one class per module (or one class with several variants)")
    _MADE[module] = name
    setup_cache.__module__ = module
    units = {"env_steps_per_sec": "env steps/s", "seconds_per_1k_env_steps": "seconds",
             "cpu_seconds_per_1k_env_steps": "seconds", "peak_host_rss_mb": "MiB", "inference_latency_ms": "ms"}
    body: dict[str, Any] = {"params": [list(variants)], "param_names": ["variant"], "timeout": timeout,
                            "setup_cache": setup_cache, "__doc__": f"Training speed of {source or trainer} (rlgauge)."}
    for metric in TRACKED:
        body[f"track_{metric}"] = _tracker(metric, units[metric])
    return type(name, (), {**body, "__module__": module})
