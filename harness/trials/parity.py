"""What a change does to the maths: the parameters of every module the factory built, after the same N
``iterate()`` calls from the same seed, compared with the unchanged trainer's, relative to how far those
calls moved the unchanged trainer's parameters (an optimizer's step is small beside the weights).

``identical`` (bitwise), ``within tolerance`` (largest relative difference below ``TOLERANCE``), or
``changes the maths``; ``not reproducible`` where the unchanged trainer run twice already differs by more than
the tolerance (its seed does not fix its results, so no change can be judged).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

IDENTICAL, WITHIN, CHANGES, NOT_REPRODUCIBLE, NOT_CHECKED = (
    "identical", "within tolerance", "changes the maths", "not reproducible", "not checked")
TOLERANCE = 1e-4
"""The largest relative difference (``max_rel_diff``) still ``within tolerance``."""
DEFAULT_ITERATIONS = 3


@dataclass(frozen=True)
class Parity:
    cls: str
    max_rel_diff: float | None = None
    note: str = ""

    @property
    def keeps_maths(self) -> bool:
        return self.cls in (IDENTICAL, WITHIN)

    def to_dict(self) -> dict[str, object]:
        return {"class": self.cls, "max_rel_diff": self.max_rel_diff, **({"note": self.note} if self.note else {})}


def max_rel_diff(reference: Path | str, other: Path | str) -> float | None:
    """The largest difference between two runs' final parameters relative to how far training moved the
    reference's (max |a - b| / max |a_final - a_initial| per tensor; a tensor training left alone: relative to
    max |a|); None when they hold other tensors."""
    import torch

    a, b = torch.load(reference, weights_only=True), torch.load(other, weights_only=True)
    final, other_final, initial = a["final"], b["final"], a["initial"]
    if final.keys() != other_final.keys() or any(final[k].shape != other_final[k].shape for k in final):
        return None
    worst = 0.0
    for key, left in final.items():
        right = other_final[key]
        if torch.equal(left, right):
            continue
        left, right = left.double(), right.double()
        start = initial.get(key)
        moved = float((left - start.double()).abs().max()) if start is not None and start.shape == left.shape else 0.0
        scale = moved if moved > 0 else (float(left.abs().max()) if left.numel() else 0.0)
        diff = float((left - right).abs().max())
        worst = max(worst, diff / scale if scale > 0 else float("inf"))
    return worst


def classify(diff: float | None, noise: float) -> Parity:
    """A change's class from its difference to the unchanged trainer and the unchanged trainer's own (``noise``)."""
    if noise > TOLERANCE:
        return Parity(NOT_REPRODUCIBLE, diff, f"the unchanged trainer run twice from its seed differs by {noise:.2g}")
    if diff is None:
        return Parity(CHANGES, None, "the modules built differ in their parameters")
    if diff == 0.0:
        return Parity(IDENTICAL, 0.0)
    return Parity(WITHIN if diff <= TOLERANCE else CHANGES, diff)
