"""RunResult: the schema-versioned result of one measured run; atomic JSON save and checked load."""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError, model_validator

from reference_trainers.common.atomic_file import write_text_atomically

from .errors import UserError

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
        if not self.min <= self.median <= self.max:
            raise ValueError(f"median {self.median:g} lies outside its own [min, max] = "
                             f"[{self.min:g}, {self.max:g}]")
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
    host_syncs_per_step: Optional[Number] = None
    warmup_s: Optional[Number] = None
    mean_return_last_k: Optional[Number] = None


class _Stability(_Open):
    float64_ops: Annotated[int, Field(ge=0)]
    nonfinite_events: Annotated[int, Field(ge=0)]
    compile_fallback: bool
    passed: bool


class _Quality(_Open):
    trustworthy: bool
    reasons: list[str]


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


def check_writable(path: Path) -> None:
    """Fail before a run starts if ``--out`` cannot be written (tried, not assumed)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"--out {path}: is a directory; give a file name such as {path / 'result.json'}")
    existing = path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"--out {path}: {existing} is a file, not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".rlgauge-write-check.", dir=existing)
    except OSError as exc:
        raise UserError(f"--out {path}: cannot create files in {existing} ({exc.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def check_output_dir(path: Path, option: str = "--out") -> Path:
    """Create the output folder ``path`` (or accept an existing one) and check files can be written there."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {path}: is a file; give a folder for the outputs")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".rlgauge-write-check.", dir=path)
    except OSError as exc:
        raise UserError(f"{option} {path}: cannot create files there ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)
    return path
