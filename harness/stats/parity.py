"""Parity classes: what each optimisation may change about the numbers, and by how much.

From the same seed, after K updates, a configuration is compared with the all-plain
reference by the loosest class among the flags it turns on. The property tests
(``tests/properties/``) and the ablation use these tolerances; which flag belongs to which
class is declared in the flag registry (``reference_trainers/config/flags.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from reference_trainers.config.flags import EXACT, FLAGS, FP_REORDER, OUTCOME, PARITY_CLASSES, REDUCED_PRECISION

__all__ = ["CLASS_ORDER", "EXACT", "FLAG_CLASSES", "FP_REORDER", "OUTCOME", "REDUCED_PRECISION",
           "REDUCED_PRECISION_BOUNDS", "TOLERANCES", "UpdateAgreement", "UpdateBounds", "combined_class", "flag_class",
           "reduced_precision_agreement"]


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    why: str


CLASS_ORDER = PARITY_CLASSES

TOLERANCES: dict[str, Tolerance] = {
    EXACT: Tolerance(1e-6, 1e-7, "the same float32 operations in the same order, batched or not: only round-off "
                                 "of identical maths (batched vs per-row matmul kernels) may differ"),
    FP_REORDER: Tolerance(1e-5, 1e-6, "the same maths with reassociated float ops (multi-tensor or fused kernels, "
                                      "compiled graphs, another thread count): errors of a few ulps per op, "
                                      "amplified a little by K Adam steps"),
}
"""Reduced precision is compared over several updates (``REDUCED_PRECISION_BOUNDS``); outcome-class
flags change the sample stream and are compared by learning outcome, not here."""

FLAG_CLASSES: dict[str, str] = {
    **{f.key: f.parity for f in FLAGS},
    **{f"{f.key}={value}": cls for f in FLAGS for value, cls in f.parity_by_value.items()},
}
"""Dotted key (or ``key=value`` where one value differs) -> parity class, from the flag registry."""


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


@dataclass(frozen=True)
class UpdateBounds:
    """How closely a reduced-precision run must follow the float32 run of the same seed over K updates.

    ``min_cosine``: the cosine between the two runs' parameter changes (``theta_K - theta_0``, all
    parameters flattened) must exceed it. ``norm_ratio``: the candidate's change norm over the
    reference's must lie in this closed band. ``loss_rtol``: at every update, each recorded loss
    may differ from float32's by at most ``loss_rtol * max(|float32 loss|, 1)``.
    """

    min_cosine: float
    norm_ratio: tuple[float, float]
    loss_rtol: float
    why: str


REDUCED_PRECISION_BOUNDS = UpdateBounds(
    min_cosine=0.5, norm_ratio=(0.5, 2.0), loss_rtol=0.25,
    why="bf16 keeps 8 significand bits and fp16 10, so a reduced-precision forward perturbs each gradient by "
        "about 1e-2 relative, and Adam's steps are lr-sized whatever the gradient's scale: over K updates the "
        "parameter change keeps float32's direction and length. fp16's GradScaler starts at 2**16 and skips the "
        "update(s) that overflow while it calibrates, so an honest fp16 run may lag float32 by a step or two; "
        "over enough updates that those are a small share of them, this turns its change by well under 60 "
        "degrees and shortens it by well under half. A reversed update (gradient ascent) turns the change past "
        "90 degrees (cosine below 0) and skipped updates leave it at zero (ratio 0): a cosine above 0.5 and a "
        "ratio within a factor of two separate the two with margins on both sides. One skipped update among K "
        "is what the GradScaler does by design, so it is not meant to fail. Losses drift further than parameters "
        "(after the first update the minibatches differ a little, and a near-tie between two actions' values may "
        "change one replayed transition), so the loss bound is a backstop for a loss that is mis-scaled, "
        "overflowing or diverging; the parameter change is what catches a wrong update.")
"""The reduced-precision class (AMP bf16/fp16, ``matmul_precision`` high/medium, TF32) over K updates:
cosine of the parameter changes above 0.5, their norm ratio within [0.5, 2], and every loss within
0.25 x max(|float32 loss|, 1) of float32's at the same update."""


@dataclass(frozen=True)
class UpdateAgreement:
    """A reduced-precision run against float32's: its cosine and norm ratio of parameter changes,
    the largest scaled loss gap over the trajectory, and what broke the bounds (empty: it passes)."""

    cosine: float
    norm_ratio: float
    loss_gap: float
    failures: tuple[str, ...]


def reduced_precision_agreement(initial: Mapping[str, torch.Tensor], candidate: Mapping[str, torch.Tensor],
                                reference: Mapping[str, torch.Tensor], candidate_losses: Mapping[str, Sequence[float]],
                                reference_losses: Mapping[str, Sequence[float]],
                                bounds: UpdateBounds = REDUCED_PRECISION_BOUNDS) -> UpdateAgreement:
    """Compare a reduced-precision run with the float32 run from the same seed and initial parameters.

    ``initial``: the parameters both runs started from; ``candidate``/``reference``: their
    parameters after K updates; ``*_losses``: each loss (by name) at every update, in order.
    """
    failures: list[str] = []
    if not (candidate.keys() == reference.keys() == initial.keys()):
        return UpdateAgreement(float("nan"), float("nan"), float("nan"), ("parameter names differ",))
    names = sorted(reference)

    def flat(params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([params[n].detach().float().reshape(-1).cpu() for n in names])

    start, ours, theirs = flat(initial), flat(candidate), flat(reference)
    if not torch.isfinite(ours).all():
        failures.append("non-finite parameters")
    ours, theirs = ours - start, theirs - start
    ours_norm, theirs_norm = float(torch.linalg.vector_norm(ours)), float(torch.linalg.vector_norm(theirs))
    if theirs_norm == 0.0:
        failures.append("the float32 run did not move: nothing to compare")
        cosine = ratio = float("nan")
    else:
        ratio = ours_norm / theirs_norm
        cosine = float(ours @ theirs) / (ours_norm * theirs_norm) if ours_norm > 0.0 else 0.0
        if not cosine > bounds.min_cosine:
            failures.append(f"cosine {cosine:.3f} of the parameter changes is not above {bounds.min_cosine}")
        low, high = bounds.norm_ratio
        if not low <= ratio <= high:
            failures.append(f"norm ratio {ratio:.3f} of the parameter changes is outside [{low}, {high}]")
    loss_gap = 0.0
    for name, want in reference_losses.items():
        got = candidate_losses.get(name, ())
        if len(got) != len(want):
            failures.append(f"{name}: {len(got)} updates recorded, float32 recorded {len(want)}")
            continue
        if not all(math.isfinite(v) for v in got):
            failures.append(f"{name}: non-finite loss")
            continue
        for step, (g, w) in enumerate(zip(got, want)):
            gap = abs(g - w) / max(abs(w), 1.0)
            loss_gap = max(loss_gap, gap)
            if gap > bounds.loss_rtol:
                failures.append(f"{name} at update {step}: {g:.6g} vs float32 {w:.6g}")
                break
    return UpdateAgreement(cosine, ratio, loss_gap, tuple(failures))
