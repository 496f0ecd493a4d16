"""RUNS.md: milestone rows formatted from results (pure), and a locked, atomic append (I/O).

The append holds a ``filelock`` lock beside the file, reads it, checks that it ends in
rlgauge's table, writes old content + new rows to a temporary file in the same folder,
fsyncs it and renames it over RUNS.md. Readers see the old file or the new one, never half
of one; parallel records queue on the lock and lose no row; earlier rows are kept byte for
byte (checked before the rename) and new rows take the file's own line ending (CRLF stays
CRLF). The file is written as ``atomic_file`` allows: a symlink's target, never a FIFO,
directory or read-only file.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from filelock import FileLock, Timeout

from reference_trainers.state.atomic_file import UnsafeTargetError, check_target, write_text_atomically

from harness.stats.compare import Ratio, independent_ratio, paired_ratio, rate_samples
from harness.errors import UserError
from harness.results import RunResult

COLUMNS = ("date", "milestone", "commit", "machine", "preset", "variant", "device", "env_steps_per_sec",
           "speedup", "inference_latency_ms p50", "peak_host_rss_mb", "peak_device_mem_mb", "stability")
HEADER = "| " + " | ".join(COLUMNS) + " |"
SEPARATOR = "|" + "|".join("---" for _ in COLUMNS) + "|"

TITLE = "# Milestone results\n"
EXPLANATION = """\
Rows are appended by `rlgauge record --milestone NAME RESULT.json...`, one per run; earlier
rows are never rewritten. Columns:

- `date`: when the run started (UTC); `milestone`: the name given to `record`.
- `commit`: the measured code (short hash; `+dirty` when it had uncommitted changes).
- `machine`: CPU, cores, torch build and the intra-op threads the run used; `device`: what it
  trained on (on CUDA with nvidia-ml-py: the GPU's mean utilisation and peak memory in use, all
  processes, during the timed segments, from NVML).
- `preset`, `variant`: what ran (`baseline`: every plain path; `optimized`: the preset's best
  settings for the device; a config file's runs carry its name and `config`).
- `env_steps_per_sec`: environment frames per second of the timed loop, median [min-max] over
  the repeats (warm-up excluded).
- `speedup`: env_steps_per_sec of this variant / the baseline variant of the same preset
  recorded with it: median of per-repeat ratios [95 % bootstrap CI] when both ran interleaved
  in one process (one result file), ratio of medians [95 % bootstrap CI] otherwise.
- `inference_latency_ms p50`: one batched action selection for all envs, copies included.
- `peak_host_rss_mb`, `peak_device_mem_mb`: peak memory of the timed loop (device: `-` on CPU).
- `stability`: `passed`, or the status and what failed (float64 ops, non-finite events,
  compile fallback, error).
"""
LOCK_TIMEOUT_S = 60.0
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


# --------------------------------------------------------------------------- rows (pure)

def _cell(text: str) -> str:
    """One table cell: single line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|") or "-"


def _date(run: RunResult) -> str:
    try:
        started = dt.datetime.fromisoformat(run.started_at)
    except ValueError:
        return run.started_at
    if started.tzinfo is not None:
        started = started.astimezone(dt.timezone.utc)
    return started.strftime("%Y-%m-%d %H:%M")


def _commit(run: RunResult) -> str:
    commit = run.git.get("commit")
    if not commit:
        return "-"
    return str(commit)[:10] + ("+dirty" if run.git.get("dirty") else "")


def _machine(run: RunResult) -> str:
    m = run.machine
    cpu = re.sub(r"\((R|TM|tm|r)\)", "", str(m.get("cpu", "?")))
    cpu = re.sub(r"\s+(CPU|Processor)\b", "", cpu)
    threads = f", {m['torch_threads']} thread{'s' * (m['torch_threads'] != 1)}" if m.get("torch_threads") else ""
    return f"{' '.join(cpu.split())}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')}{threads}"


def _device(run: RunResult) -> str:
    device, name = str(run.machine.get("device") or run.config.get("device", "?")), run.machine.get("device_name")
    util, memory = run.metrics.get("gpu_utilization_pct"), run.metrics.get("gpu_peak_memory_mb")
    nvml = "" if util is None else f"; NVML: {util:.0f} % busy" + (
        "" if memory is None else f", {memory:,.0f} MB in use at peak")
    return f"{device} ({name}{nvml})" if name and device != "cpu" and name != device else device + (
        f" ({nvml[2:]})" if nvml else "")


def _rate(run: RunResult) -> str:
    block = run.metrics.get("env_steps_per_sec")
    if not block:
        return "-"
    return f"{block['median']:,.0f} [{block['min']:,.0f}-{block['max']:,.0f}]"


def _number(value: object, digits: int) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:,.{digits}f}"


def _stability(run: RunResult) -> str:
    s = run.stability
    problems = [f"{k}={s.get(k)}" for k in ("float64_ops", "nonfinite_events") if s.get(k)]
    if s.get("compile_fallback"):
        problems.append("compile_fallback")
    if run.error:
        problems.append(run.error[:100])
    if run.status == "ok" and s.get("passed") and not problems:
        return "passed"
    return f"{run.status}" + (f": {', '.join(problems)}" if problems else "")


def speedups(groups: list[list[RunResult]]) -> dict[int, Ratio]:
    """Speedup vs baseline for each run (keyed by ``id(run)``) where a baseline of its preset was given.

    A baseline in the same group (one result file: one process, interleaved) gives a paired
    ratio; otherwise the first baseline of the preset among all groups, an independent one.
    """
    all_runs = [r for g in groups for r in g]
    out: dict[int, Ratio] = {}
    for group in groups:
        for run in group:
            if run.variant == "baseline":
                continue
            same = next((b for b in group if b.preset == run.preset and b.variant == "baseline"), None)
            base = same or next((b for b in all_runs if b.preset == run.preset and b.variant == "baseline"), None)
            b, c = (rate_samples(base, "env_steps_per_sec") if base else None), rate_samples(run, "env_steps_per_sec")
            if not b or not c:
                continue
            paired = same is not None and len(b) == len(c)
            out[id(run)] = paired_ratio(b, c) if paired else independent_ratio(b, c)
    return out


def format_rows(milestone: str, groups: list[list[RunResult]]) -> list[str]:
    """One table row per run, in order; ``groups`` are the runs of each result file."""
    ratios = speedups(groups)
    rows = []
    for run in (r for g in groups for r in g):
        ratio = ratios.get(id(run))
        latency = (run.metrics.get("inference_latency_ms") or {}).get("p50")
        cells = (_date(run), milestone, _commit(run), _machine(run), run.preset, run.variant, _device(run),
                 _rate(run), ratio.fmt() if ratio else "-", _number(latency, 3),
                 _number(run.metrics.get("peak_host_rss_mb"), 0), _number(run.metrics.get("peak_device_mem_mb"), 0),
                 _stability(run))
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return rows


def check_milestone(name: str) -> str:
    if not name.strip() or "\n" in name or "\r" in name:
        raise UserError(f"--milestone {name!r}: give a non-empty, one-line name (e.g. v0.2 or 'fused adam')")
    return " ".join(name.split())


# --------------------------------------------------------------------------- the file (I/O)

def new_file_text() -> str:
    return f"{TITLE}\n{EXPLANATION}\n{HEADER}\n{SEPARATOR}\n"


def _split(line: str) -> list[str]:
    """The cells of a table row (``|`` escaped as ``\\|`` stays inside its cell)."""
    parts = _CELL_SPLIT.split(line.strip())
    return [p.strip() for p in parts[1:-1]] if len(parts) >= 2 else []


def _is_separator(line: str) -> bool:
    cells = _split(line)
    return len(cells) == len(COLUMNS) and all(re.fullmatch(r":?-{3,}:?", c) for c in cells)


def _trim_blank_tail(lines: list[str]) -> list[str]:
    lines = list(lines)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def table_end(text: str, path: Path) -> str | None:
    """The text to append rows to (trailing blank lines dropped), or None when there is no table yet.

    ``UserError`` when the file has a table that is not rlgauge's, a row with the wrong number of
    cells, or text after the table (rows go at the end of the file, so the table must end it).
    """
    lines = _trim_blank_tail(text.split("\n"))
    start = next((i for i, line in enumerate(lines) if _split(line) == list(COLUMNS)), None)
    if start is None:
        foreign = next((i for i, line in enumerate(lines) if line.lstrip().startswith("|")), None)
        if foreign is not None:
            raise UserError(f"{path}: line {foreign + 1}: a table that is not rlgauge's milestone table "
                            f"(expected the columns {', '.join(COLUMNS)})")
        return None
    if start + 1 >= len(lines) or not _is_separator(lines[start + 1]):
        raise UserError(f"{path}: line {start + 2}: expected the table's separator row {SEPARATOR!r}")
    for number, line in enumerate(lines[start + 2:], start=start + 3):
        if not line.lstrip().startswith("|"):
            raise UserError(f"{path}: line {number}: text after the milestone table; rows are appended "
                            "at the end of the file, so the table must end it")
        found = len(_split(line))
        if not line.rstrip().endswith("|") or found != len(COLUMNS):
            raise UserError(f"{path}: line {number}: broken table row (expected {len(COLUMNS)} cells "
                            f"between pipes, found {found})")
    return "\n".join(lines) + "\n"


def append_rows(path: Path, rows: list[str], *, lock_timeout: float = LOCK_TIMEOUT_S) -> None:
    """Append ``rows`` to the table of ``path`` (created with its header if missing), locked and atomic.

    A symlinked RUNS.md is followed (its target gets the rows; the lock lies beside the target); a
    RUNS.md that is not a regular file, or is read-only, is refused before anything is read."""
    path = Path(path)
    try:
        real = check_target(path)
    except UnsafeTargetError as exc:
        raise UserError(str(exc)) from None
    if not real.parent.is_dir():
        raise UserError(f"{path}: folder {real.parent} does not exist")
    lock = FileLock(f"{real}.lock", timeout=lock_timeout)
    try:
        with lock:
            _append_locked(path, real, rows)
    except Timeout:
        raise UserError(f"{path}: still locked by another 'rlgauge record' after {lock_timeout:g} s "
                        f"(lock file {real}.lock)") from None


def line_ending(text: str) -> str:
    """The file's line ending, CRLF or LF: that of its last line break (LF when it has none)."""
    last = text.rfind("\n")
    return "\r\n" if last > 0 and text[last - 1] == "\r" else "\n"


def appended_text(old: str | None, rows: list[str], path: Path) -> tuple[str, int]:
    """The new file text and how many of its leading characters are ``old``'s, unchanged (pure).

    Everything up to the end of the last non-blank line is kept byte for byte; trailing blank lines
    go (the rows must follow the table); new lines use the file's own line ending."""
    if old is None or not old.strip():
        eol = "\n" if old is None else line_ending(old)
        return (new_file_text() + "".join(row + "\n" for row in rows)).replace("\n", eol), 0
    eol = line_ending(old)
    end = table_end(old.replace("\r\n", "\n"), path)  # parsed without the \r; raises for a broken table
    kept = "\n".join(_trim_blank_tail(old.split("\n")))  # the last kept line without its line break
    base = kept + ("\n" if kept.endswith("\r") else eol)  # the last line's own ending, or the file's
    if end is None:
        base += f"\n{EXPLANATION}\n{HEADER}\n{SEPARATOR}\n".replace("\n", eol)
    return base + "".join(row + eol for row in rows), len(kept)


def _append_locked(path: Path, real: Path, rows: list[str]) -> None:
    try:
        old = real.read_bytes().decode("utf-8") if real.exists() else None  # bytes: no newline translation
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    new, kept = appended_text(old, rows, path)
    if old is not None and new[:kept] != old[:kept]:  # the promise to the reader: earlier content is never rewritten
        raise RuntimeError(f"{path}: appending would rewrite earlier content; nothing written")
    try:
        write_text_atomically(real, new, make_folder=False)
    except UnsafeTargetError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
