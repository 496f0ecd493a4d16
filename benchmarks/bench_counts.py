"""Deterministic cost counts of each preset variant, per env step of training and per action selection:
the noise-free layer.

No timer: ``cost_instrument`` (this suite's own, so both commits of a comparison are counted by the same
code) counts aten ops dispatched, host syncs, float64 ops, bytes of new op outputs and Python calls
per env step while ``COUNT_STEPS`` env steps train after ``WARMUP_STEPS`` of warm-up, in a trainer built
with the preset's seed; then per batched action selection over ``COUNT_SELECTIONS`` selections of a
fixed observation batch (the inference path, whose latency the suite tracks). The same commit gives the
same counts in every process on every machine load, so ``make asv-counts`` compares two commits at a
factor of ``ASV_COUNT_FACTOR`` (near 1): a commit that adds a sync or a kernel per step shows on
the noisiest runner. Hardware instructions retired are tracked where the kernel exposes the counter
(not exact between processes: reported by ``asv-report``, never gated). Every count is measured once
per benchmark run (``setup_cache``); the ``track_`` methods only read.
"""

from __future__ import annotations

import torch

from .common import COUNT_PRESETS, COUNT_STEPS, DEVICES, PARAM_NAMES, PARAMS, VARIANTS, available, build, \
    observations, skip_unless_available, train_env_steps, WARMUP_STEPS
from .cost_instrument import count_costs

COUNT_SELECTIONS = 32
"""Batched action selections counted per preset variant (after one uncounted selection)."""


def _select(trainer, selections: int) -> int:  # noqa: ANN001 - a trainer
    obs = observations(trainer.config.env.id, trainer.num_envs)
    for _ in range(selections):
        trainer.select_actions(obs)
    return selections


def measure_counts() -> dict[str, dict[str, float | None]]:
    """Every available (preset, variant, device): its training counts per env step and its acting counts per
    selection (``acting_`` before their names)."""
    counts: dict[str, dict[str, float | None]] = {}
    for preset in COUNT_PRESETS:
        for device in DEVICES:
            if not available(device):
                continue
            for variant in VARIANTS:
                trainer = build(preset, variant, device)
                try:
                    train_env_steps(trainer, WARMUP_STEPS)
                    training = count_costs(lambda: train_env_steps(trainer, COUNT_STEPS), torch.device(trainer.device))
                    trainer.activate()
                    _select(trainer, 1)
                    acting = count_costs(lambda: _select(trainer, COUNT_SELECTIONS), torch.device(trainer.device))
                    counts[f"{preset}/{variant}/{device}"] = training | {f"acting_{k}": v for k, v in acting.items()}
                finally:
                    trainer.close()
    return counts


class CostCounts:
    params = PARAMS
    param_names = PARAM_NAMES
    timeout = 900
    # asv versions a benchmark by its own source, which here only reads the cache: bump this whenever the
    # instrument (cost_instrument) or what is counted changes
    version = "2"

    def setup_cache(self) -> dict[str, dict[str, float | None]]:
        return measure_counts()

    setup_cache.timeout = 900  # type: ignore[attr-defined]

    def setup(self, counts: dict, preset: str, variant: str, device: str) -> None:
        skip_unless_available(device)
        if preset not in COUNT_PRESETS:
            raise NotImplementedError(f"{preset}: not in the counted set (common.COUNT_PRESETS)")
        self.counts = counts[f"{preset}/{variant}/{device}"]

    def _count(self, name: str) -> float:
        value = self.counts[name]
        if value is None:  # asv's skip, not a zero
            raise NotImplementedError(f"{name}: this machine's kernel exposes no counter for it")
        return value

    def track_aten_ops_per_env_step(self, counts: dict, preset: str, variant: str, device: str) -> float:
        return self._count("aten_ops")

    track_aten_ops_per_env_step.unit = "ops"  # type: ignore[attr-defined]

    def track_host_syncs_per_env_step(self, counts: dict, preset: str, variant: str, device: str) -> float:
        return self._count("host_syncs")

    track_host_syncs_per_env_step.unit = "syncs"  # type: ignore[attr-defined]

    def track_float64_ops_per_env_step(self, counts: dict, preset: str, variant: str, device: str) -> float:
        return self._count("float64_ops")

    track_float64_ops_per_env_step.unit = "ops"  # type: ignore[attr-defined]

    def track_output_bytes_per_env_step(self, counts: dict, preset: str, variant: str, device: str) -> float:
        return self._count("output_bytes")

    track_output_bytes_per_env_step.unit = "bytes"  # type: ignore[attr-defined]

    def track_python_calls_per_env_step(self, counts: dict, preset: str, variant: str, device: str) -> float:
        return self._count("python_calls")

    track_python_calls_per_env_step.unit = "calls"  # type: ignore[attr-defined]

    def track_instructions_per_env_step(self, counts: dict, preset: str, variant: str, device: str) -> float:
        """Where the kernel allows it; not exact between processes, so reported, never gated."""
        return self._count("instructions")

    track_instructions_per_env_step.unit = "instructions"  # type: ignore[attr-defined]

    def track_acting_aten_ops_per_selection(self, counts: dict, preset: str, variant: str, device: str) -> float:
        return self._count("acting_aten_ops")

    track_acting_aten_ops_per_selection.unit = "ops"  # type: ignore[attr-defined]

    def track_acting_host_syncs_per_selection(self, counts: dict, preset: str, variant: str, device: str) -> float:
        return self._count("acting_host_syncs")

    track_acting_host_syncs_per_selection.unit = "syncs"  # type: ignore[attr-defined]

    def track_acting_float64_ops_per_selection(self, counts: dict, preset: str, variant: str, device: str) -> float:
        return self._count("acting_float64_ops")

    track_acting_float64_ops_per_selection.unit = "ops"  # type: ignore[attr-defined]

    def track_acting_output_bytes_per_selection(self, counts: dict, preset: str, variant: str, device: str) -> float:
        return self._count("acting_output_bytes")

    track_acting_output_bytes_per_selection.unit = "bytes"  # type: ignore[attr-defined]

    def track_acting_python_calls_per_selection(self, counts: dict, preset: str, variant: str, device: str) -> float:
        return self._count("acting_python_calls")

    track_acting_python_calls_per_selection.unit = "calls"  # type: ignore[attr-defined]
