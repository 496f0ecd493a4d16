"""RUNS.md (``harness.report.runs_md``): rows, and an append that is locked, atomic and never rewrites a row."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from filelock import FileLock
from results_factory import make_result

from harness.report import runs_md
from harness.errors import UserError
from harness.results import load_results, save_results
from harness.report.runs_md import (
    COLUMNS,
    HEADER,
    append_rows,
    check_milestone,
    format_rows,
    new_file_text,
    table_end,
)
from reference_trainers.state import atomic_file

REPO_ROOT = Path(__file__).resolve().parent.parent


def cells(row: str) -> list[str]:
    return [c.strip() for c in runs_md._CELL_SPLIT.split(row.strip())[1:-1]]


def table_rows(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(HEADER)
    return lines[start + 2:]


# --------------------------------------------------------------------------- rows (pure)

def test_a_row_has_every_column_in_order() -> None:
    (row,) = format_rows("v0.1", [[make_result("optimized", [1000.0, 1100.0, 900.0], commit="abcdef0123456789",
                                               dirty=True)]])
    values = dict(zip(COLUMNS, cells(row)))
    assert len(cells(row)) == len(COLUMNS)
    assert values["date"] == "2026-01-02 03:04" and values["milestone"] == "v0.1"
    assert values["commit"] == "abcdef0123+dirty"
    assert values["machine"] == "Intel Xeon, 2 cores, torch 2.13.0+cpu"
    threaded = make_result()
    threaded.machine["torch_threads"] = 1
    assert cells(format_rows("m", [[threaded]])[0])[COLUMNS.index("machine")].endswith("torch 2.13.0+cpu, 1 thread")
    assert (values["preset"], values["variant"], values["device"]) == ("ppo-cartpole", "optimized", "cpu")
    assert values["env_steps_per_sec"] == "1,000 [900-1,100]"
    assert values["speedup"] == "-"  # no baseline recorded with it
    assert values["inference_latency_ms p50"] == "0.250" and values["peak_host_rss_mb"] == "300"
    assert values["peak_device_mem_mb"] == "-" and values["stability"] == "passed"


def test_speedup_is_paired_within_a_file_and_independent_across_files() -> None:
    one_file = [[make_result("baseline", [100.0, 200.0, 100.0]), make_result("optimized", [300.0, 400.0, 500.0])]]
    base_row, opt_row = format_rows("m", one_file)
    assert cells(base_row)[COLUMNS.index("speedup")] == "-"
    assert cells(opt_row)[COLUMNS.index("speedup")] == "3.00x [2.00-5.00]"  # per-round ratios 3, 2, 5
    two_files = [[make_result("baseline", [100.0, 200.0, 100.0])], [make_result("optimized", [300.0, 400.0, 500.0])]]
    speedup = cells(format_rows("m", two_files)[1])[COLUMNS.index("speedup")]
    assert speedup.startswith("4.00x [")  # ratio of medians 400 / 100


def test_unstable_and_failed_runs_say_what_failed() -> None:
    unstable, failed = format_rows("m", [[make_result(status="unstable", float64_ops=2),
                                          make_result(samples=[], status="failed", error="RuntimeError: boom")]])
    assert cells(unstable)[-1] == "unstable: float64_ops=2"
    assert cells(failed)[-1] == "failed: RuntimeError: boom"
    assert cells(failed)[COLUMNS.index("env_steps_per_sec")] == "-"


def test_pipes_and_newlines_in_values_cannot_break_the_table() -> None:
    (row,) = format_rows("a|b", [[make_result(error="line one\nline | two", status="failed", samples=[])]])
    assert "\n" not in row and len(cells(row)) == len(COLUMNS)
    assert cells(row)[1] == "a\\|b"


@pytest.mark.parametrize("name", ["", "   ", "two\nlines"])
def test_a_milestone_needs_a_one_line_name(name: str) -> None:
    with pytest.raises(UserError, match="--milestone"):
        check_milestone(name)


# --------------------------------------------------------------------------- the file

def test_first_append_creates_the_file_with_its_explained_header(tmp_path: Path) -> None:
    path = tmp_path / "RUNS.md"
    append_rows(path, ["| " + " | ".join(["x"] * len(COLUMNS)) + " |"])
    text = path.read_text(encoding="utf-8")
    assert text.startswith(new_file_text())
    for column in COLUMNS:
        assert f"`{column}`" in text, f"the header does not explain {column}"
    assert len(table_rows(text)) == 1


def test_appending_keeps_every_earlier_byte_and_adds_rows_at_the_end(tmp_path: Path) -> None:
    path = tmp_path / "RUNS.md"
    append_rows(path, format_rows("one", [[make_result("baseline"), make_result("optimized")]]))
    before = path.read_bytes()
    append_rows(path, format_rows("two", [[make_result("optimized")]]))
    after = path.read_bytes()
    assert after.startswith(before)
    assert [cells(r)[1] for r in table_rows(after.decode())] == ["one", "one", "two"]


def test_a_preamble_without_a_table_is_kept_and_the_table_added_below(tmp_path: Path) -> None:
    path = tmp_path / "RUNS.md"
    path.write_text("# Our runs\n\nNotes we keep.\n", encoding="utf-8")
    append_rows(path, format_rows("m", [[make_result()]]))
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# Our runs\n\nNotes we keep.\n")
    assert len(table_rows(text)) == 1


def test_trailing_blank_lines_and_a_missing_final_newline_are_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "RUNS.md"
    append_rows(path, format_rows("a", [[make_result()]]))
    path.write_text(path.read_text(encoding="utf-8") + "\n\n", encoding="utf-8")
    append_rows(path, format_rows("b", [[make_result()]]))
    path.write_text(path.read_text(encoding="utf-8").rstrip("\n"), encoding="utf-8")
    append_rows(path, format_rows("c", [[make_result()]]))
    assert [cells(r)[1] for r in table_rows(path.read_text(encoding="utf-8"))] == ["a", "b", "c"]


def test_a_reformatted_header_and_separator_still_count_as_our_table(tmp_path: Path) -> None:
    path = tmp_path / "RUNS.md"
    padded = "|" + "|".join(f"  {c}  " for c in COLUMNS) + "|"
    path.write_text(f"{padded}\n|" + "|".join(":-----:" for _ in COLUMNS) + "|\n", encoding="utf-8")
    append_rows(path, format_rows("m", [[make_result()]]))
    assert len(path.read_text(encoding="utf-8").splitlines()) == 3


BROKEN = {
    "a foreign table": "| a | b |\n|---|---|\n| 1 | 2 |\n",
    "a row with a missing cell": None,
    "text after the table": None,
    "a truncated last row": None,
    "no separator": f"{HEADER}\n| x |\n",
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_table_is_a_one_line_user_error_and_nothing_is_written(tmp_path: Path, case: str) -> None:
    path = tmp_path / "RUNS.md"
    good = new_file_text() + format_rows("m", [[make_result()]])[0] + "\n"
    text = BROKEN[case] or {
        "a row with a missing cell": good + "| 1 | 2 | 3 |\n",
        "text after the table": good + "\nSome notes.\n",
        "a truncated last row": good + good.splitlines()[-1][:40] + "\n",
    }[case]
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as err:
        append_rows(path, format_rows("new", [[make_result()]]))
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert path.read_text(encoding="utf-8") == text
    assert table_end(good, path) == good


def test_an_interrupted_append_leaves_the_old_file_and_no_temporary(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "RUNS.md"
    append_rows(path, format_rows("one", [[make_result()]]))
    before = path.read_bytes()

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic_file.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        append_rows(path, format_rows("two", [[make_result()]]))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["RUNS.md", "RUNS.md.lock"]


def test_a_record_killed_mid_write_leaves_a_valid_file_and_frees_the_lock(tmp_path: Path) -> None:
    """SIGKILL while the new content is half written: RUNS.md is untouched, the next append works."""
    path = tmp_path / "RUNS.md"
    append_rows(path, format_rows("one", [[make_result()]]))
    before = path.read_bytes()
    started = tmp_path / "started"
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(REPO_ROOT / 'tests')!r})
        from harness.report import runs_md
        from reference_trainers.state import atomic_file
        from results_factory import make_result
        real_fsync = os.fsync
        def stall(fd):
            open({str(started)!r}, "w").close()
            time.sleep(60)
        atomic_file.os.fsync = stall
        runs_md.append_rows(runs_md.Path({str(path)!r}), runs_md.format_rows("killed", [[make_result()] * 50]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the writer never reached fsync"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert path.read_bytes() == before
    append_rows(path, format_rows("after", [[make_result()]]), lock_timeout=5)
    assert [cells(r)[1] for r in table_rows(path.read_text(encoding="utf-8"))] == ["one", "after"]


def _append_many(args: tuple[str, int]) -> None:
    path, worker = args
    for i in range(5):
        append_rows(Path(path), format_rows(f"w{worker}-{i}", [[make_result()]]))


def test_parallel_records_lose_no_row(tmp_path: Path) -> None:
    path = tmp_path / "RUNS.md"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_append_many, [(str(path), w) for w in range(8)])
    rows = table_rows(path.read_text(encoding="utf-8"))
    assert sorted(cells(r)[1] for r in rows) == sorted(f"w{w}-{i}" for w in range(8) for i in range(5))
    assert table_end(path.read_text(encoding="utf-8"), path) is not None


def test_sixteen_record_processes_started_together_append_every_row_intact(tmp_path: Path) -> None:
    """Real ``python -m harness record`` processes, all started before any finishes, on one RUNS.md."""
    path = tmp_path / "RUNS.md"
    append_rows(path, format_rows("before", [[make_result()]]))
    earlier = path.read_text(encoding="utf-8")
    result = tmp_path / "r.json"
    save_results(result, [make_result("baseline"), make_result("optimized", [3000.0, 3030.0, 2970.0])])
    procs = [subprocess.Popen([sys.executable, "-m", "harness", "record", "--milestone", f"p{i:02d}", str(result),
                               "--runs-md", str(path)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(16)]
    outcomes = [(proc.wait(timeout=120), proc.stderr.read()) for proc in procs]
    for proc in procs:
        proc.stdout.close()
        proc.stderr.close()
    assert [code for code, _ in outcomes] == [0] * 16, outcomes
    text = path.read_text(encoding="utf-8")
    assert text.startswith(earlier)  # earlier rows kept byte for byte
    assert table_end(text, path) is not None  # still one valid table
    rows = table_rows(text)
    assert len(rows) == 1 + 16 * 2 and all(len(cells(r)) == len(COLUMNS) for r in rows)
    assert sorted(cells(r)[1] for r in rows[1:]) == sorted(f"p{i:02d}" for i in range(16) for _ in range(2))
    expected = format_rows("p00", [load_results(result)])
    for i in range(16):  # each process's pair of rows arrived whole and together
        mine = [r for r in rows if cells(r)[1] == f"p{i:02d}"]
        assert mine == [row.replace("| p00 |", f"| p{i:02d} |") for row in expected]
        assert rows.index(mine[1]) == rows.index(mine[0]) + 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["RUNS.md", "RUNS.md.lock", "r.json"]


def test_a_held_lock_times_out_as_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "RUNS.md"
    with FileLock(f"{path}.lock"):
        with pytest.raises(UserError, match="still locked"):
            append_rows(path, format_rows("m", [[make_result()]]), lock_timeout=0.2)
    assert not path.exists()


def test_the_checked_in_runs_md_is_a_valid_table() -> None:
    path = REPO_ROOT / "RUNS.md"
    assert table_end(path.read_text(encoding="utf-8"), path) is not None
