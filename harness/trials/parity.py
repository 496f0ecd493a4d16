"""What a change does to the maths: the state of every module the factory built (parameters and buffers) and of
every optimizer that stepped, after the same N ``iterate()`` calls from the same seed, compared with the unchanged
trainer's, relative to how far those calls moved the unchanged trainer's values (an optimizer's step is small
beside the weights).

``identical`` (bitwise, NaN equal to NaN at the same place), ``within tolerance`` (largest relative difference
below ``TOLERANCE``), or ``changes the maths``: more than that, other tensors, or a NaN/Inf where the unchanged
trainer has a finite value (or the reverse); ``not reproducible`` where the unchanged trainer run twice already
differs by more than the tolerance (its seed does not fix its results, so no change can be judged).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class Difference:
    """Two runs' final states compared: ``value`` the largest relative difference (``inf``: a tensor whose NaN/Inf
    places differ; None: other tensors), ``where`` the tensor it was found in, ``note`` why when it is not a
    number."""

    value: float | None
    where: str = ""
    note: str = ""


def _nonfinite_differ(left: Any, right: Any) -> int:
    """Places where one side is NaN/Inf and the other is not (or another NaN/Inf): 0 when they agree."""
    import torch

    if not left.is_floating_point() and not left.is_complex():
        return 0
    same = (torch.isnan(left) == torch.isnan(right)) & (torch.isposinf(left) == torch.isposinf(right)) \
        & (torch.isneginf(left) == torch.isneginf(right))
    return int((~same).sum())


def _finite_max(values: Any) -> float:
    """max |values| over the finite entries (0.0 when there are none)."""
    import torch

    finite = values[torch.isfinite(values)]
    return float(finite.abs().max()) if finite.numel() else 0.0


def compare(reference: dict[str, Any], other: dict[str, Any]) -> Difference:
    """``reference`` and ``other`` as saved by the child (``{"initial", "final"}``, each name -> tensor)."""
    import torch

    final, other_final, initial = reference["final"], other["final"], reference["initial"]
    if final.keys() != other_final.keys():
        missing = sorted(set(final) ^ set(other_final))
        return Difference(None, missing[0], f"the state differs in what it holds ({len(missing)} tensors, e.g. "
                                            f"{missing[0]})")
    worst = Difference(0.0)
    for key, left in final.items():
        right = other_final[key]
        if left.shape != right.shape:
            return Difference(None, key, f"{key} has shape {tuple(right.shape)}, unchanged {tuple(left.shape)}")
        if torch.equal(left, right):
            continue
        places = _nonfinite_differ(left, right)
        if places:
            return Difference(math.inf, key, f"{places} NaN/Inf values in {key} where the unchanged trainer has "
                                             "others (finite, or another NaN/Inf)")
        both = torch.isfinite(left.double()) & torch.isfinite(right.double())
        a, b = left.double()[both], right.double()[both]
        diff = float((a - b).abs().max()) if a.numel() else 0.0
        if diff == 0.0:
            continue  # they differ only where both are NaN
        start = initial.get(key)
        moved = _finite_max(left.double() - start.double()) \
            if start is not None and start.shape == left.shape else 0.0
        scale = moved if moved > 0 else _finite_max(left.double())
        value = diff / scale if scale > 0 else math.inf
        if not value <= (worst.value or 0.0):
            worst = Difference(value, key)
    return worst


def load(path: Path | str) -> dict[str, Any]:
    import torch

    return torch.load(path, weights_only=True)


def max_rel_diff(reference: Path | str, other: Path | str) -> float | None:
    """The largest difference between two runs' final states (``compare``) from their files."""
    return compare(load(reference), load(other)).value


def classify(diff: float | Difference | None, noise: float) -> Parity:
    """A change's class from its difference to the unchanged trainer and the unchanged trainer's own (``noise``)."""
    found = diff if isinstance(diff, Difference) else Difference(diff)
    if not noise <= TOLERANCE:  # NaN noise is not reproducible either
        return Parity(NOT_REPRODUCIBLE, found.value, f"the unchanged trainer run twice from its seed differs by "
                                                     f"{noise:.2g}")
    if found.value is None:
        return Parity(CHANGES, None, found.note or "the modules built differ in their state")
    if found.value == 0.0:
        return Parity(IDENTICAL, 0.0)
    if found.value <= TOLERANCE:
        return Parity(WITHIN, found.value)
    note = found.note or (f"largest in {found.where}" if found.where else "")
    return Parity(CHANGES, found.value if math.isfinite(found.value) else None, note)
