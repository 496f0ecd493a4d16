"""Training throughput of each preset variant, tracked across commits.

asv treats lower as better, so ``track_env_steps_per_sec`` (higher is better, for reading:
the median over the repeats, as in a result file) has a lower-is-better twin,
``track_seconds_per_1k_env_steps``, for regression detection (``asv continuous`` gates on it).
The twin is the *fastest* repeat: load from other processes only ever adds time, so the best
of several short repeats moves far less between two runs on a busy machine than the median.
All variants of a preset are measured once per benchmark run, interleaved in one process
(``setup_cache``), so machine drift hits them alike; the ``track_`` methods only read. These
are the history drawn on the site; asv judges ``track_`` values by the factor alone (one value
per commit, no samples), so they are not what a merge is gated on.

``TrainingCpuTime.time_train_env_steps`` is: the process CPU seconds of ``CPU_TIME_STEPS`` env steps
of training after warm-up, ``CPU_TIME_REPEATS`` samples in each of ``CPU_TIME_ROUNDS``
processes per commit, which ``asv continuous`` interleaves across the two commits and judges
with its Mann-Whitney test (docs/tracking.md has the A/A measurements behind this choice).
"""

from __future__ import annotations

from harness.measurement.runner import run_variants

from .common import CPU_TIME_STEPS, DEVICES, CpuTimeBenchmark, PARAM_NAMES, PARAMS, PRESETS, VARIANTS, \
    available, skip_unless_available, skip_unless_cpu, spec, throughput_overrides, \
    train_env_steps, warmed_trainer


def measure_all() -> dict[str, dict[str, float]]:
    """Every available (preset, variant, device): median rates of a short interleaved run."""
    rates: dict[str, dict[str, float]] = {}
    for preset in PRESETS:
        specs = [spec(preset, variant, throughput_overrides(preset, device))
                 for device in DEVICES if available(device) for variant in VARIANTS]
        results, _ = run_variants(specs, say=lambda _text: None)
        for result in results:
            if result.status != "ok":
                raise RuntimeError(f"{preset}/{result.variant} on {result.config['device']}: {result.status} "
                                   f"({result.error or result.stability})")
            key = f"{preset}/{result.variant}/{result.config['device']}"
            rates[key] = {name: result.metrics[name]["median"] for name in ("env_steps_per_sec", "updates_per_sec")}
            rates[key]["best_env_steps_per_sec"] = result.metrics["env_steps_per_sec"]["max"]
    return rates


class Throughput:
    params = PARAMS
    param_names = PARAM_NAMES
    timeout = 600

    def setup_cache(self) -> dict[str, dict[str, float]]:
        return measure_all()

    setup_cache.timeout = 600  # type: ignore[attr-defined]

    def setup(self, rates: dict[str, dict[str, float]], preset: str, variant: str, device: str) -> None:
        skip_unless_available(device)
        self.rates = rates[f"{preset}/{variant}/{device}"]

    def track_env_steps_per_sec(self, rates: dict, preset: str, variant: str, device: str) -> float:
        return self.rates["env_steps_per_sec"]

    track_env_steps_per_sec.unit = "steps/s"  # type: ignore[attr-defined]

    def track_seconds_per_1k_env_steps(self, rates: dict, preset: str, variant: str, device: str) -> float:
        return 1000.0 / self.rates["best_env_steps_per_sec"]

    track_seconds_per_1k_env_steps.unit = "s"  # type: ignore[attr-defined]

    def track_updates_per_sec(self, rates: dict, preset: str, variant: str, device: str) -> float:
        return self.rates["updates_per_sec"]

    track_updates_per_sec.unit = "updates/s"  # type: ignore[attr-defined]


class TrainingCpuTime(CpuTimeBenchmark):
    """CPU seconds of ``CPU_TIME_STEPS[preset]`` env steps of training (collection and updates),
    after ``WARMUP_STEPS`` of warm-up in the same process (``setup``, once per process)."""

    def setup(self, preset: str, variant: str, device: str) -> None:
        skip_unless_cpu(device)
        if preset not in CPU_TIME_STEPS:
            raise NotImplementedError(f"{preset}: not in the gated training set (common.CPU_TIME_STEPS); "
                                      "Throughput tracks it")
        self.trainer = warmed_trainer(preset, variant, device)
        self.trainer.activate()

    def time_train_env_steps(self, preset: str, variant: str, device: str) -> None:
        train_env_steps(self.trainer, CPU_TIME_STEPS[preset])
