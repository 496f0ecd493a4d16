"""Which changes to try on a diagnosed trainer: those whose rule fired (or the ``--only`` list), with the
lines a source change edits, and the reason a change cannot run here (a CUDA-only change on a CPU)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.diagnosis.host_syncs import DISTRIBUTION_CHECKS
from harness.errors import UserError
from harness.trials.catalogue import A_A, CHANGES, Change, accepted


@dataclass
class Candidate:
    change: Change
    sites: list[str] = field(default_factory=list)
    """``file:line`` of the findings it addresses (the lines a source change edits)."""
    skip: str | None = None
    """Why it is not tried (set here or when its edit is refused)."""


def parse_only(text: str | None) -> list[str] | None:
    """``--only a,b``: the names, each one the catalogue has; ``UserError`` listing the accepted names."""
    if text is None:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in CHANGES]
    if unknown or not names:
        what = f"unknown change {unknown[0]!r}" if unknown else "no change named"
        raise UserError(f"--only {text}: {what}; accepted: {accepted()}")
    return list(dict.fromkeys(names))


def sites_of(name: str, d: dict[str, Any]) -> list[str]:
    """The lines of the diagnosis ``d`` a change addresses, first found first."""
    if name == "float32_at_source":
        return [d["float64"][0]["where"]] if d.get("float64") else []
    if name == "no_grad_acting":
        return [r["where"] for r in d.get("graph_building_acting", []) if r["where"] != "?"]
    if name in ("validate_args_off", "no_validate_args"):
        rows = [s["where"] for s in d.get("host_syncs", []) if s.get("cause") == DISTRIBUTION_CHECKS]
        return [where for where in dict.fromkeys(rows) if where != "?"]
    return []


def candidates(d: dict[str, Any], only: list[str] | None) -> list[Candidate]:
    """The changes to try, in catalogue order: every change one of whose rules fired in ``d``, and those tried
    always (the A/A arm, threads, autocast) (``only``: those named, whatever fired, and the A/A arm)."""
    fired = {r["rule"] for r in d.get("recommendations", [])}
    on_cuda = str(d.get("device", "cpu")).startswith("cuda")
    chosen = []
    for name, change in CHANGES.items():
        if only is not None and name not in only and name != A_A:  # the A/A arm: in every try
            continue
        if only is None and not (change.always or fired & set(change.rules)):
            continue
        candidate = Candidate(change, sites_of(name, d))
        if change.cuda_only and not on_cuda:
            candidate.skip = f"applies to CUDA only; this trainer runs on {d.get('device', 'cpu')}"
        elif change.kind == "source" and not candidate.sites:
            candidate.skip = "the diagnosis found no line for it to edit"
        chosen.append(candidate)
    return chosen
