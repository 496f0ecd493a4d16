"""RunResult: the schema-versioned result of one measured run; atomic JSON save and checked load."""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError, model_validator

from reference_trainers.state.atomic_file import (UnsafeTargetError, check_folder, check_target, kind_of,
                                                   write_text_atomically)

from harness.errors import UserError

SCHEMA_VERSION = 1
STATUSES = ("ok", "unstable", "failed", "interrupted")
_REQUIRED = ("preset", "variant", "algo", "status", "started_at", "git", "machine", "config", "metrics", "stability")


@dataclass
class RunResult:
    preset: str
    variant: str
    algo: str
    status: str
    started_at: str
    git: dict[str, Any]
    machine: dict[str, Any]
    config: dict[str, Any]
    metrics: dict[str, Any]
    stability: dict[str, Any]
    resolution: dict[str, str] = field(default_factory=dict)
    steps_completed: int = 0
    error: str | None = None
    machine_state: dict[str, Any] = field(default_factory=dict)
    """Load, other processes' CPU share and threads around the run (``{}`` in older files)."""
    quality: dict[str, Any] | None = None
    """``{"trustworthy": bool, "reasons": [str]}`` (None in older files)."""
    trainer_stdout: str | None = None
    """The file a ``--quiet`` run captured the trainer's own stdout to (None: nothing printed, or not quiet)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, source: str = "result") -> "RunResult":
        """A run read from JSON: ``UserError`` (one line naming ``source`` and the key) for a wrong shape.

        Fields this version does not know are ignored (files from newer writers load); fields
        added within schema version 1 (``resolution``, ``steps_completed``, ``error``,
        ``machine_state``, ``quality``) default.
        """
        if not isinstance(data, dict):
            raise UserError(f"{source}: a run must be a JSON object")
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise UserError(f"{source}: run is missing {', '.join(missing)}")
        if data["status"] not in STATUSES:
            raise UserError(f"{source}: status {data['status']!r} is not one of {', '.join(STATUSES)}")
        try:
            _RunShape.model_validate(data)
        except ValidationError as exc:
            raise UserError(f"{source}: {_shape_problem(exc)}") from None
        problem = _inconsistency(data)
        if problem is not None:
            raise UserError(f"{source}: {problem}")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


# --------------------------------------------------------------------------- the shape a reader relies on

class _Open(BaseModel):
    """A JSON object whose listed keys are checked; other keys (newer writers) are kept."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)


Rate = Annotated[float, Field(gt=0)]
Number = Union[StrictFloat, StrictInt]


class _RateBlock(_Open):
    median: Rate
    min: Rate
    max: Rate
    samples: list[Rate] = Field(min_length=1)

    @model_validator(mode="after")
    def _median_within_its_range(self) -> "_RateBlock":
        # the runner writes metrics.spread(samples): min <= median <= max, and every sample in between
        if self.min > self.max:
            raise ValueError(f"min {self.min:g} is greater than max {self.max:g}")
        if not self.min <= self.median <= self.max:
            raise ValueError(f"median {self.median:g} lies outside its own [min, max] = "
                             f"[{self.min:g}, {self.max:g}]")
        outside = [s for s in self.samples if not self.min <= s <= self.max]
        if outside:
            raise ValueError(f"sample {outside[0]:g} lies outside its own [min, max] = [{self.min:g}, {self.max:g}]")
        return self


class _Latency(_Open):
    p50: Number
    p95: Number


class _Metrics(_Open):
    env_steps_per_sec: Optional[_RateBlock]
    agent_steps_per_sec: Optional[_RateBlock]
    updates_per_sec: Optional[_RateBlock]
    cpu_seconds_per_1k_env_steps: Optional[_RateBlock] = None
    inference_latency_ms: Optional[_Latency] = None
    phase_seconds: Optional[dict[str, Number]] = None
    peak_host_rss_mb: Optional[Number] = None
    peak_device_mem_mb: Optional[Number] = None
    device_utilization_pct: Optional[Number] = None
    gpu_utilization_pct: Optional[Annotated[Number, Field(ge=0, le=100)]] = None
    gpu_peak_memory_mb: Optional[Annotated[Number, Field(ge=0)]] = None
    host_syncs_per_step: Optional[Number] = None
    warmup_s: Optional[Number] = None
    end_to_end_s: Optional[Annotated[Number, Field(ge=0)]] = None
    end_to_end_env_steps_per_sec: Optional[Annotated[Number, Field(ge=0)]] = None
    inductor_cache: Optional[dict[Literal["hit", "miss", "bypass"], Annotated[int, Field(ge=0)]]] = None
    mean_return_last_k: Optional[Number] = None


class _Stability(_Open):
    float64_ops: Annotated[int, Field(ge=0)]
    nonfinite_events: Annotated[int, Field(ge=0)]
    compile_fallback: bool
    passed: bool


class _Quality(_Open):
    trustworthy: bool
    reasons: list[str]

    @model_validator(mode="after")
    def _verdict_matches_its_reasons(self) -> "_Quality":
        # quality.assess: trustworthy exactly when there is no reason
        if self.trustworthy and self.reasons:
            raise ValueError(f"trustworthy is true, yet it gives reasons not to trust the run ({self.reasons[0]!r})")
        if not self.trustworthy and not self.reasons:
            raise ValueError("trustworthy is false but no reason is given")
        return self


class _Git(_Open):
    commit: Optional[str]
    dirty: bool


class _RunShape(_Open):
    preset: str
    variant: str
    algo: str
    started_at: str
    git: _Git
    machine: dict[str, Any]
    config: dict[str, Any]
    metrics: _Metrics
    stability: _Stability
    resolution: dict[str, str] = {}
    steps_completed: Annotated[int, Field(ge=0)] = 0
    error: Optional[str] = None
    machine_state: dict[str, Any] = {}
    quality: Optional[_Quality] = None


_REPEATED_RATES = ("env_steps_per_sec", "agent_steps_per_sec", "updates_per_sec")
"""Rates the runner appends once per timed repeat, together (``runner._timed_segment``)."""


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _inconsistency(data: dict[str, Any]) -> str | None:
    """What contradicts the rest of a well-shaped run (``key: why``), or None. Only what the runner
    guarantees for a run with status ok (every repeat timed to its end), and only where the file
    records both sides (older files without ``steps_completed`` or ``config.run`` are not judged)."""
    if data["status"] != "ok":
        return None
    run = data["config"].get("run")
    repeats, steps = (_count(run.get("repeats")), _count(run.get("steps"))) if isinstance(run, dict) else (None, None)
    if repeats is not None:
        for key in _REPEATED_RATES:
            block = data["metrics"].get(key)
            if block is not None and len(block["samples"]) != repeats:
                return (f"metrics.{key}.samples: {len(block['samples'])} samples, but config.run.repeats is "
                        f"{repeats} and the run's status is ok (every repeat measured)")
    if repeats is not None and steps is not None and "steps_completed" in data \
            and data["steps_completed"] < repeats * steps:
        return (f"steps_completed: {data['steps_completed']:,} timed env steps, fewer than config.run.repeats x "
                f"config.run.steps = {repeats} x {steps:,} for a run whose status is ok")
    return None


def _shape_problem(exc: ValidationError) -> str:
    """The first problem of a run's shape, as ``key.path: what was expected (got ...)``."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "run"
    got = repr(error.get("input"))
    got = got if len(got) <= 40 else got[:37] + "..."
    message = re.sub(r"valid dictionary( or instance of \w+)?", "JSON object", error["msg"])
    message = message.removeprefix("Value error, ")  # a model validator's own sentence
    message = message[:1].lower() + message[1:]
    more = len(exc.errors()) - 1
    return f"{where}: {message} (got {got})" + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")


def save_results(path: Path, runs: list[RunResult]) -> None:
    """Write ``{"schema_version", "runs"}`` atomically (temporary file in the same folder, then rename)."""
    payload = json.dumps({"schema_version": SCHEMA_VERSION, "runs": [r.to_dict() for r in runs]}, indent=2)
    write_text_atomically(path, payload + "\n")


def load_results(path: Path) -> list[RunResult]:
    """Read a result file; ``UserError`` naming the file for anything missing, corrupt or foreign."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"result file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read result file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict) or "runs" not in data or "schema_version" not in data:
        raise UserError(f"{path}: not an rlgauge result file (expected an object with schema_version and runs)")
    if data["schema_version"] != SCHEMA_VERSION:
        raise UserError(f"{path}: schema_version {data['schema_version']!r} is not supported; accepted: {SCHEMA_VERSION}")
    if not isinstance(data["runs"], list):
        raise UserError(f"{path}: runs must be a list")
    return [RunResult.from_dict(run, f"{path} run {i}") for i, run in enumerate(data["runs"])]


def check_writable(path: Path, option: str = "--out") -> None:
    """Fail before a run starts if ``option``'s file cannot be written: ``atomic_file.check_target``'s
    rules (a regular, writable file or a new one, symlinks followed), then a file tried in its folder."""
    path = Path(path)
    try:
        real = check_target(path)
    except UnsafeTargetError as exc:
        raise UserError(f"{option} {exc}") from None
    _try_creating_a_file(real.parent, f"{option} {path}")


def check_output_dir(path: Path, option: str = "--out", files: Iterable[str] = ()) -> Path:
    """Create the output folder ``path`` (or accept an existing one) and check files can be written
    there; each of ``files`` (the names the command will write) must pass ``check_target`` too."""
    path = Path(path)
    try:
        st: os.stat_result | None = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # new, or below a non-folder (check_folder says which)
        st = None
    except OSError as exc:
        raise UserError(f"{option} {path}: cannot be used as a folder ({exc.strerror or exc})") from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        what = "a file" if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)
        raise UserError(f"{option} {path}: is {what}; give a folder for the outputs")
    try:
        check_folder(path, path)
        for name in files:
            check_target(path / name)
    except UnsafeTargetError as exc:
        raise UserError(f"{option} {exc}") from None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{option} {path}: cannot create files there ({exc.strerror or exc})") from None
    _try_creating_a_file(path, f"{option} {path}")
    return path


def _try_creating_a_file(folder: Path, label: str) -> None:
    """Create and remove a probe file in ``folder`` (or its first existing ancestor): the rules cannot
    see everything (a read-only or special file system), so writing is tried, not assumed."""
    existing = Path(folder)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        fd, probe = tempfile.mkstemp(prefix=".rlgauge-write-check.", dir=existing)
    except OSError as exc:
        raise UserError(f"{label}: cannot create files in {existing} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)
