"""Parity classes: what each optimisation may change about the numbers, and by how much.

From the same seed, after K updates, a configuration is compared with the all-plain
reference by the loosest class among the flags it turns on. The property tests
(``tests/properties/``) and the ablation use this table; it is the one place that says
which flag belongs where.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    why: str


EXACT, FP_REORDER, REDUCED_PRECISION, OUTCOME = "exact", "fp-reorder", "reduced-precision", "outcome"
CLASS_ORDER = (EXACT, FP_REORDER, REDUCED_PRECISION, OUTCOME)

TOLERANCES: dict[str, Tolerance] = {
    EXACT: Tolerance(1e-6, 1e-7, "the same float32 operations in the same order, batched or not: only round-off "
                                 "of identical maths (batched vs per-row matmul kernels) may differ"),
    FP_REORDER: Tolerance(1e-5, 1e-6, "the same maths with reassociated float ops (multi-tensor or fused kernels, "
                                      "compiled graphs, another thread count): errors of a few ulps per op, "
                                      "amplified a little by K Adam steps"),
    REDUCED_PRECISION: Tolerance(2e-2, 2e-3, "bf16 keeps 8 significand bits (relative error ~4e-3 per op) and fp16 "
                                             "10 bits; after one update parameters move by lr-sized steps, so "
                                             "they stay within 2e-2 relative (2e-3 absolute) of float32"),
}
"""Outcome-class flags change the sample stream; they are compared by learning outcome, not here."""

FLAG_CLASSES: dict[str, str] = {
    "env.vectorization=sync": EXACT,
    "env.vectorization=async": EXACT,
    "env.vectorization=native": OUTCOME,
    "env.vectorization=envpool": OUTCOME,
    "env.action_repeat": OUTCOME,
    "optimizations.batch_inference": EXACT,
    "optimizations.inference_batch_size": EXACT,
    "optimizations.sync_free_logging": EXACT,
    "optimizations.replay": EXACT,
    "optimizations.uint8_transfer": EXACT,
    "optimizations.num_workers": EXACT,
    "optimizations.pinned_memory": EXACT,
    "optimizations.non_blocking": EXACT,
    "optimizations.optimizer_impl": FP_REORDER,
    # a graph needs capturable Adam: step counts and bias corrections as float32 device tensors
    "optimizations.cuda_graphs": FP_REORDER,
    "optimizations.lean_rollout": FP_REORDER,
    "optimizations.analytic_grads": FP_REORDER,
    "optimizations.numpy_acting": FP_REORDER,
    "optimizations.compile_model": FP_REORDER,
    "optimizations.compile_train_step": FP_REORDER,
    "optimizations.torch_threads": FP_REORDER,
    "optimizations.amp": REDUCED_PRECISION,
    "optimizations.matmul_precision": REDUCED_PRECISION,
    "optimizations.tf32": REDUCED_PRECISION,
}


def flag_class(key: str, value: object) -> str:
    """Parity class of setting ``key`` (dotted) to ``value``."""
    specific = FLAG_CLASSES.get(f"{key}={value}")
    if specific is not None:
        return specific
    if key not in FLAG_CLASSES:
        raise KeyError(f"no parity class recorded for {key}")
    return FLAG_CLASSES[key]


def combined_class(settings: dict[str, object]) -> str:
    """The loosest class among the settings that differ from the plain path."""
    classes = [flag_class(k, v) for k, v in settings.items()] or [EXACT]
    return max(classes, key=CLASS_ORDER.index)
