"""Reference effects: each flag's speedup measured on rlgauge's own trainers, as ``rlgauge ablate --effects``
wrote it, and the line ``rlgauge diagnose`` quotes beside a recommendation.

The data file (``reference_effects.json`` beside this module, shipped in the wheel) holds one entry per
preset, device kind and flag: the flag alone on the preset's baseline (``+flag / baseline``) and its
share of the full stack (``all-on / -flag``), each the median paired per-repeat ratio with its bracket,
and when, where and with which code it was measured. ``ablate --effects`` replaces the entries of the
same preset, device kind and flag under a lock, atomically; every other entry is kept. The figures are
the reference trainers', never the user's, and every line quoting them says so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal, Optional

from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, model_validator

from reference_trainers.state.atomic_file import UnsafeTargetError, check_target, write_text_atomically

from harness.errors import UserError
from harness.stats import power

SCHEMA_VERSION = 1
DEFAULT_PATH = Path(__file__).resolve().with_name("reference_effects.json")
"""The packaged data file (package data of ``harness``: an installed wheel has it)."""
LOCK_TIMEOUT_S = 60.0
LABEL = "reference trainers' figure (not yours)"
DeviceKind = Literal["cpu", "cuda", "mps"]
_ABOUT = ("Speedups measured by 'rlgauge ablate PRESET --effects FILE' on rlgauge's own reference trainers "
          "(not a user's trainer); 'rlgauge diagnose' quotes them. One entry per preset, device kind and flag.")
_IGNORED_SETTINGS = ("run.steps=", "run.repeats=", "device=", "seed=")
"""Overrides an entry records elsewhere (steps, repeats, device kind) or that change no speed (seed)."""


class ReferenceEffectsError(UserError):
    """A reference-effects file that cannot be read or written; ``str(err)`` is one line naming the file."""


class EffectRatio(BaseModel):
    """A median paired per-repeat ratio and its bracket."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    median: float = Field(gt=0)
    low: float = Field(gt=0)
    high: float = Field(gt=0)
    n: StrictInt = Field(ge=1)
    """Paired repeats."""
    bracket: Literal["interval", "range"]
    """``interval``: the 95 % percentile bootstrap interval of the median; ``range``: the min-max of the
    ratios (fewer than ``power.MIN_REPEATS`` repeats, too few for an interval)."""

    def text(self) -> str:
        if self.bracket == "range":
            return f"{self.median:.2f}x (range {self.low:.2f}-{self.high:.2f} over {self.n} repeats)"
        return f"{self.median:.2f}x [{self.low:.2f}-{self.high:.2f}]"


class Change(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    from_: Any = Field(alias="from")
    """The baseline's resolved value."""
    to: Any
    """The value the flag resolves to on this device kind in the measured arm."""

    def text(self) -> str:
        return f"{self.from_} -> {self.to}"


class ReferenceEffect(BaseModel):
    """One flag on one preset and device kind, as one ablation measured it."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    flag: str
    """The flag's short name (``batch_inference``, ``vectorization``)."""
    key: str
    """Its dotted config key (``optimizations.batch_inference``, ``env.vectorization``)."""
    change: Change
    preset: str
    device: DeviceKind
    settings: list[str] = []
    """``--set`` overrides the ablation ran with beyond the preset ([] for the preset as shipped)."""
    alone: Optional[EffectRatio]
    """``+flag / baseline``; None for a flag that builds on another (measured in the stack only)."""
    in_stack: Optional[EffectRatio]
    """``all-on / -flag``; None when the ablation measured this flag only."""
    verdict_alone: str
    verdict_in_stack: str
    trustworthy: StrictBool
    """Whether the runs the quoted ratio pairs were all trustworthy (``harness.stats.quality``)."""
    reasons: list[str] = []
    """Why not, when not trustworthy."""
    measured: str = Field(pattern=r"^\d{4}-\d\d-\d\d$")
    machine: str
    """``2-core Intel Xeon (x86-64) CPU``, ``NVIDIA H200 GPU (16-core AMD EPYC host)``."""
    torch: str
    commit: Optional[str]
    dirty: StrictBool
    """Whether the measured checkout had uncommitted changes to tracked files."""
    steps: Optional[StrictInt] = None
    repeats: Optional[StrictInt] = None

    @model_validator(mode="after")
    def _has_a_ratio(self) -> "ReferenceEffect":
        if self.alone is None and self.in_stack is None:
            raise ValueError("an entry needs 'alone' or 'in_stack'")
        return self

    @property
    def slot(self) -> tuple[str, str, str]:
        """What an entry replaces: the one of the same preset, device kind and flag."""
        return self.preset, self.device, self.key

    def figure(self, *, say_alone: bool = True, change: str = "") -> str:
        """``alone on ppo-cartpole: 1.07x [1.01-1.29]`` (``, untrustworthy`` when its runs were not);
        ``change`` (`` (forloop -> fused)``) follows the preset."""
        where = self.preset + change + (f" (with {', '.join(self.settings)})" if self.settings else "")
        ratio = self.alone if self.alone is not None else self.in_stack
        assert ratio is not None  # the validator
        how = (f"{'alone ' * say_alone}on {where}" if self.alone is not None
               else f"in the full stack of {where} (all-on / -flag)")
        return f"{how}: {ratio.text()}" + ("" if self.trustworthy else ", untrustworthy")

    def provenance(self) -> str:
        return f"measured {self.measured} on a {self.machine}"

    def why_untrustworthy(self) -> str:
        return self.reasons[0] if self.reasons else "its runs were not judged"


class _EffectsFile(BaseModel):
    model_config = ConfigDict(extra="ignore")
    schema_version: Literal[1]
    entries: list[ReferenceEffect]


# --------------------------------------------------------------------------- reading

def device_kind(device: str) -> str:
    """``cuda:1`` -> ``cuda``: figures are matched by the kind of device, not its index."""
    return device.split(":")[0]


def read_effects(path: Path | None = None, *, missing_ok: bool = False) -> list[ReferenceEffect]:
    """Every entry of ``path`` (default: the packaged file); ``ReferenceEffectsError`` for a file that is
    missing (unless ``missing_ok``), unreadable, not JSON, of another schema version or of a wrong shape."""
    path = DEFAULT_PATH if path is None else Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        if missing_ok:
            return []
        raise ReferenceEffectsError(f"{path}: no reference-effects file there (write one with "
                                    f"'rlgauge ablate PRESET --effects {path}')") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReferenceEffectsError(f"{path}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReferenceEffectsError(f"{path}: not a reference-effects file: invalid JSON at line {exc.lineno} "
                                    f"({exc.msg})") from None
    return parse_effects(data, str(path))


def parse_effects(data: Any, source: str) -> list[ReferenceEffect]:
    """The entries of a decoded file; ``ReferenceEffectsError`` naming ``source`` and the first problem."""
    if not isinstance(data, dict) or "entries" not in data or "schema_version" not in data:
        raise ReferenceEffectsError(f"{source}: not a reference-effects file (expected a JSON object with "
                                    "schema_version and entries)")
    version = data["schema_version"]
    if version != SCHEMA_VERSION:
        raise ReferenceEffectsError(f"{source}: schema_version {version!r} is not one this rlgauge reads "
                                    f"({SCHEMA_VERSION}); upgrade rlgauge or rewrite the file with "
                                    "'rlgauge ablate --effects'")
    try:
        return _EffectsFile.model_validate(data).entries
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise ReferenceEffectsError(f"{source}: not a reference-effects file: {where}: "
                                    f"{error['msg'].removeprefix('Value error, ')}") from None


def matching(flag: str, device: str, entries: list[ReferenceEffect]) -> list[ReferenceEffect]:
    """The entries of ``flag`` (short or dotted name) measured on ``device``'s kind, one per preset."""
    kind = device_kind(device)
    seen: set[str] = set()
    found = []
    for entry in entries:
        if flag in (entry.flag, entry.key) and entry.device == kind and entry.preset not in seen:
            seen.add(entry.preset)
            found.append(entry)
    return found


def quotable(entries: list[ReferenceEffect]) -> list[ReferenceEffect]:
    """The entries a user is shown: measured trustworthy (no other load, repeats that agree) from a clean commit.
    A figure from a busy machine or from uncommitted code is kept in the file, never quoted."""
    return [e for e in entries if e.trustworthy and not e.dirty]


def effects_for(flag: str | None, device: str, path: Path | None = None) -> list[dict[str, Any]]:
    """The entries ``effect_of`` quotes, as JSON-ready dicts (the file's own keys); [] for none."""
    if flag is None:
        return []
    return [e.model_dump(mode="json", by_alias=True) for e in quotable(matching(flag, device, read_effects(path)))]


def effect_of(flag: str | None, device: str, path: Path | None = None) -> str:
    """The measured effect of ``flag`` on the reference trainers on this kind of device, labelled as theirs,
    or a plain statement that there is none."""
    if flag is None:
        return "no speed figure: rlgauge has no flag for this to measure on its trainers"
    measured = matching(flag, device, read_effects(path))
    found = quotable(measured)
    if not found:
        if measured:
            return (f"no reference figure: rlgauge's measurement of {flag} on a {device_kind(device)} device was not "
                    "trustworthy or not from a clean commit (make reference-effects on a quiet machine refreshes it)")
        return f"no reference figure: rlgauge has not measured {flag} on a {device_kind(device)} device"
    first = found[0]
    parts = [f"{first.flag} ({first.change.text()}) {first.figure()}"]
    for before, entry in zip(found, found[1:]):
        if entry.provenance() != before.provenance():  # each date and machine once, after its figures
            parts[-1] += f", {before.provenance()}"
        change = f" ({entry.change.text()})" if entry.change != first.change else ""
        parts.append(entry.figure(say_alone=first.alone is None, change=change))
    parts.append(found[-1].provenance())
    label = LABEL if len(found) == 1 else LABEL.replace("figure", "figures")
    return f"{label}: " + "; ".join(parts)


# --------------------------------------------------------------------------- writing

def machine_text(machine: dict[str, Any]) -> str:
    """A short machine description from a result's ``machine``: ``2-core Intel Xeon (x86-64) CPU``."""
    cpu = f"{machine.get('cores', '?')}-core {short_cpu(str(machine.get('cpu', '')))}"
    kind = device_kind(str(machine.get("device", "cpu")))
    name = str(machine.get("device_name", ""))
    if kind == "cpu":
        return f"{cpu} ({name.replace('_', '-')}) CPU" if name else f"{cpu} CPU"
    return f"{name or kind} GPU ({cpu} host)" if kind == "cuda" else f"{name or 'Apple'} (MPS)"


def short_cpu(name: str) -> str:
    """``Intel(R) Xeon(R) CPU @ 2.20GHz`` -> ``Intel Xeon``; ``AMD EPYC 7B13 64-Core Processor`` -> ``AMD EPYC 7B13``."""
    name = re.sub(r"\((R|TM|tm)\)|@.*$|\b\d+-Core\b|\bProcessor\b|\bCPU\b", " ", name)
    return " ".join(name.split()) or "unknown"


def entries_from_ablation(ablation: dict[str, Any], settings: list[str]) -> list[ReferenceEffect]:
    """The entries of one ``ablation.json`` (``harness.analyses.ablate.ablation_json``): each flag with a
    measured ratio; ``settings``: the ``--set`` overrides the ablation ran with."""
    arms = ablation["arms"]
    machine = ablation["machine"]
    kept = [s for s in settings if not s.startswith(_IGNORED_SETTINGS)]
    entries = []
    for flag in ablation["flags"]:
        if flag["alone"] is None and flag["in_stack"] is None:
            continue
        paired = ("baseline", f"+{flag['name']}") if flag["alone"] is not None else ("all-on", f"-{flag['name']}")
        qualities = [(arms.get(arm) or {}).get("quality") or {} for arm in paired]
        reasons = [r for q in qualities for r in q.get("reasons", [])]
        entries.append(ReferenceEffect(
            flag=flag["key"].rpartition(".")[2], key=flag["key"],
            change=Change(from_=flag["plain"], to=flag["resolved"]), preset=ablation["preset"],
            device=device_kind(ablation["device"]), settings=kept,
            alone=_ratio(flag["alone"]), in_stack=_ratio(flag["in_stack"]),
            verdict_alone=flag["verdict_alone"], verdict_in_stack=flag["verdict_in_stack"],
            trustworthy=all(q.get("trustworthy") is True for q in qualities), reasons=list(dict.fromkeys(reasons)),
            measured=ablation["started_at"][:10], machine=machine_text(machine), torch=str(machine.get("torch")),
            commit=(ablation.get("git") or {}).get("commit"), dirty=bool((ablation.get("git") or {}).get("dirty")),
            steps=ablation.get("steps"), repeats=ablation.get("repeats")))
    return entries


def _ratio(data: dict[str, Any] | None) -> EffectRatio | None:
    if data is None:
        return None
    bracket = "interval" if power.has_power(data["n"]) else "range"
    return EffectRatio(median=data["median"], low=data["low"], high=data["high"], n=data["n"], bracket=bracket)


def check_effects_file(path: Path) -> Path:
    """Before measuring: ``path`` may be written and, where it exists, reads as a reference-effects file.
    Returns the real file (a symlink's target); ``ReferenceEffectsError`` otherwise."""
    try:
        real = check_target(Path(path))
    except UnsafeTargetError as exc:
        raise ReferenceEffectsError(f"--effects {exc}") from None
    if not real.parent.is_dir():
        raise ReferenceEffectsError(f"--effects {path}: folder {real.parent} does not exist")
    read_effects(real, missing_ok=True)
    return real


def record_effects(path: Path, entries: list[ReferenceEffect], *, lock_timeout: float = LOCK_TIMEOUT_S
                   ) -> tuple[int, int]:
    """Add ``entries`` to ``path`` (created if missing), each replacing the entry of its preset, device kind
    and flag; under a lock beside the file, written atomically. Returns (added, replaced)."""
    real = check_effects_file(path)
    try:
        with FileLock(f"{real}.lock", timeout=lock_timeout):
            old = read_effects(real, missing_ok=True)
            new_slots = {e.slot for e in entries}
            kept = [e for e in old if e.slot not in new_slots]
            merged = sorted([*kept, *entries], key=lambda e: e.slot)
            write_text_atomically(real, effects_text(merged), make_folder=False)
    except Timeout:
        raise ReferenceEffectsError(f"--effects {path}: still locked by another 'rlgauge ablate' after "
                                    f"{lock_timeout:g} s (lock file {real}.lock)") from None
    except UnsafeTargetError as exc:
        raise ReferenceEffectsError(f"--effects {exc}") from None
    except OSError as exc:
        raise ReferenceEffectsError(f"--effects {path}: cannot be written ({exc.strerror or exc})") from None
    replaced = len(old) - len(kept)
    return len(entries) - replaced, replaced


def effects_text(entries: list[ReferenceEffect]) -> str:
    """The file's text: the schema version, a sentence for the human reader, the entries."""
    payload = {"schema_version": SCHEMA_VERSION, "about": _ABOUT,
               "entries": [e.model_dump(mode="json", by_alias=True) for e in entries]}
    return json.dumps(payload, indent=2) + "\n"
