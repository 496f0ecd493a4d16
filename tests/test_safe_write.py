"""The one safe writer (``reference_trainers.state.atomic_file``) and what goes through it.

Targets that are not regular files, read-only files and unwritable folders are refused and left
as they were; symlinks are followed (the link stays a link); an existing file keeps its mode and
a new one gets the umask's; RUNS.md appends keep every earlier byte and the file's line endings.
Never ``/dev/*``: FIFOs, links and read-only files are made in ``tmp_path``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from results_factory import make_result

from harness.analyses import matrix
from harness.cli import main
from harness.errors import UserError
from harness.results import check_output_dir, check_writable, load_results, save_results
from harness.report.runs_md import append_rows, format_rows, new_file_text
from reference_trainers.state import atomic_file
from reference_trainers.state.atomic_file import UnsafeTargetError, write_atomically, write_text_atomically
from reference_trainers.config.errors import ConfigError


@pytest.fixture
def umask() -> Iterator[None]:
    """Let a test set the process umask; the old one comes back afterwards."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _no_temporaries(*folders: Path) -> None:
    for folder in folders:
        assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []


# --------------------------------------------------------------------------- what is refused

def test_a_fifo_is_refused_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "result.json"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeTargetError, match="is a FIFO") as caught:
        write_text_atomically(fifo, "{}")
    assert isinstance(caught.value, OSError) and isinstance(caught.value, ConfigError)  # exit 2 in every CLI
    assert "\n" not in str(caught.value) and str(caught.value).startswith(str(fifo))
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and _entries(tmp_path) == ["result.json"]


def test_a_directory_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "result.json"
    folder.mkdir()
    with pytest.raises(UnsafeTargetError, match="is a directory"):
        write_text_atomically(folder, "{}")
    assert folder.is_dir() and _entries(tmp_path) == ["result.json"]


def test_a_read_only_file_is_refused_even_for_root(tmp_path: Path) -> None:
    """Root passes ``os.access`` for any file: the write bits decide, so this holds as root too."""
    target = tmp_path / "RUNS.md"
    target.write_bytes(b"kept\n")
    target.chmod(0o444)
    with pytest.raises(UnsafeTargetError, match=r"is read-only \(mode 0444\)"):
        write_text_atomically(target, "replaced\n")
    assert target.read_bytes() == b"kept\n" and _mode(target) == 0o444 and _entries(tmp_path) == ["RUNS.md"]


def test_a_folder_without_write_bits_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(UnsafeTargetError, match="not writable"):
            write_text_atomically(folder / "r.json", "{}")
        with pytest.raises(UnsafeTargetError, match="not writable"):
            write_text_atomically(folder / "sub" / "r.json", "{}")
        assert _entries(folder) == []
    finally:
        folder.chmod(0o755)


def test_a_path_below_a_fifo_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeTargetError, match=r"is a FIFO \(named pipe\), not a directory"):
        write_text_atomically(fifo / "r.json", "{}")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_symlink_loop_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(UnsafeTargetError, match="symlink"):
        write_text_atomically(tmp_path / "a", "{}")


# --------------------------------------------------------------------------- symlinks are followed

def test_a_symlink_is_followed_and_its_target_written_in_the_targets_folder(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    real_dir, link_dir = tmp_path / "real", tmp_path / "links"
    real_dir.mkdir()
    link_dir.mkdir()
    target = real_dir / "result.json"
    target.write_text("old\n", encoding="utf-8")
    target.chmod(0o640)
    link = link_dir / "result.json"
    link.symlink_to(target)
    renames: list[tuple[Path, Path]] = []
    replace = os.replace

    def recording(src: str | Path, dst: str | Path) -> None:
        renames.append((Path(src), Path(dst)))
        replace(src, dst)

    monkeypatch.setattr(atomic_file.os, "replace", recording)
    write_text_atomically(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text(encoding="utf-8") == "new\n" and _mode(target) == 0o640
    ((src, dst),) = renames
    assert src.parent == real_dir and dst == target  # the temporary file lay beside the real file
    assert _entries(link_dir) == ["result.json"] and _entries(real_dir) == ["result.json"]


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "result.json"
    link.symlink_to(tmp_path / "real.json")
    write_text_atomically(link, "{}\n")
    assert link.is_symlink() and (tmp_path / "real.json").read_text(encoding="utf-8") == "{}\n"


def test_a_symlink_to_a_read_only_file_or_a_fifo_is_refused(tmp_path: Path) -> None:
    read_only, fifo = tmp_path / "ro.json", tmp_path / "pipe"
    read_only.write_text("kept\n", encoding="utf-8")
    read_only.chmod(0o444)
    os.mkfifo(fifo)
    for target, needle in ((read_only, "is read-only"), (fifo, "is a FIFO")):
        link = tmp_path / f"link-{target.name}"
        link.symlink_to(target)
        with pytest.raises(UnsafeTargetError, match=needle):
            write_text_atomically(link, "{}")
        assert link.is_symlink()
    assert read_only.read_text(encoding="utf-8") == "kept\n" and stat.S_ISFIFO(os.lstat(fifo).st_mode)


# --------------------------------------------------------------------------- modes

@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_new_files_get_the_umasks_mode(tmp_path: Path, umask: None, mask: int, expected: int) -> None:
    """``tempfile.mkstemp`` creates 0600 whatever the umask: that is why result and report files
    came out 0600 beside 0644 PNGs. The temporary file is now created 0666 and the kernel applies
    the umask, as for any other tool's output."""
    os.umask(mask)
    write_text_atomically(tmp_path / "a.txt", "x")
    write_atomically(tmp_path / "sub" / "b.bin", lambda handle: handle.write(b"x"))
    save_results(tmp_path / "result.json", [make_result()])
    assert {name: _mode(tmp_path / name) for name in ("a.txt", "sub/b.bin", "result.json")} == dict.fromkeys(
        ("a.txt", "sub/b.bin", "result.json"), expected)


def test_every_matrix_report_file_gets_the_same_mode(tmp_path: Path, umask: None) -> None:
    os.umask(0o022)
    runs = [make_result("baseline"), make_result("optimized", [1500.0, 1510.0, 1490.0])]
    matrix.write_report(tmp_path, [matrix.PresetRow("ppo-cartpole", runs)])
    modes = {p.name: _mode(p) for p in tmp_path.iterdir()}
    assert set(modes) == {"report.md", "report.html", matrix.SPEEDUP_CHART, matrix.THROUGHPUT_CHART}
    assert set(modes.values()) == {0o644}, modes


def test_an_existing_file_keeps_its_mode(tmp_path: Path, umask: None) -> None:
    target = tmp_path / "result.json"
    target.write_text("old", encoding="utf-8")
    target.chmod(0o604)
    os.umask(0o077)
    write_text_atomically(target, "new")
    assert target.read_text(encoding="utf-8") == "new" and _mode(target) == 0o604


# --------------------------------------------------------------------------- the checks before a run

def test_check_writable_applies_the_same_rules(tmp_path: Path) -> None:
    fifo, read_only, link = tmp_path / "pipe.json", tmp_path / "ro.json", tmp_path / "link.json"
    os.mkfifo(fifo)
    read_only.write_text("kept", encoding="utf-8")
    read_only.chmod(0o444)
    link.symlink_to(read_only)
    for path, needle in ((fifo, "is a FIFO"), (read_only, "is read-only"), (link, "is read-only"),
                         (tmp_path, "is a directory"), (fifo / "r.json", "not a directory")):
        with pytest.raises(UserError, match=needle) as caught:
            check_writable(path, "--out")
        assert str(caught.value).startswith(f"--out {path}: ") and "\n" not in str(caught.value)
    check_writable(tmp_path / "new" / "r.json")  # a new file in a missing folder is fine, and nothing is made
    (tmp_path / "ok.json").write_text("{}", encoding="utf-8")
    (tmp_path / "ok-link.json").symlink_to(tmp_path / "ok.json")
    check_writable(tmp_path / "ok-link.json")
    assert _entries(tmp_path) == ["link.json", "ok-link.json", "ok.json", "pipe.json", "ro.json"]


def test_check_output_dir_refuses_a_fifo_a_file_and_unsafe_output_names(tmp_path: Path) -> None:
    fifo, afile, folder = tmp_path / "pipe", tmp_path / "afile", tmp_path / "out"
    os.mkfifo(fifo)
    afile.write_text("kept", encoding="utf-8")
    folder.mkdir()
    os.mkfifo(folder / "report.html")
    (folder / "runs.json").write_text("kept", encoding="utf-8")
    (folder / "runs.json").chmod(0o444)
    cases = [(fifo, (), "is a FIFO (named pipe); give a folder"), (afile, (), "is a file; give a folder"),
             (folder, ("report.html",), "report.html: is a FIFO"), (folder, ("runs.json",), "runs.json: is read-only"),
             (fifo / "sub", (), "not a directory")]
    for path, files, needle in cases:
        with pytest.raises(UserError) as caught:
            check_output_dir(path, "--out", files=files)
        assert needle in str(caught.value) and str(caught.value).startswith("--out ")
    assert check_output_dir(folder, files=("report.md",)) == folder
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and afile.read_text(encoding="utf-8") == "kept"


def test_a_checkpoint_goes_through_the_safe_writer(tmp_path: Path) -> None:
    from reference_trainers.state.checkpoint import FORMAT, VERSION, load_checkpoint, save_checkpoint

    payload = {"format": FORMAT, "version": VERSION, "kind": "run"}
    fifo = tmp_path / "ppo-cartpole.ckpt.pt"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeTargetError, match="is a FIFO"):
        save_checkpoint(fifo, payload)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    real = tmp_path / "kept" / "real.ckpt.pt"
    real.parent.mkdir()
    link = tmp_path / "link.ckpt.pt"
    link.symlink_to(real)
    save_checkpoint(link, payload)
    assert link.is_symlink() and load_checkpoint(real)["kind"] == "run"


# --------------------------------------------------------------------------- RUNS.md

def _crlf(text: str) -> bytes:
    return text.replace("\n", "\r\n").encode("utf-8")


@pytest.mark.parametrize("tail", ["", "\r\n\r\n", "<no final newline>"])
def test_a_crlf_runs_md_keeps_every_earlier_byte_and_its_line_endings(tmp_path: Path, tail: str) -> None:
    path = tmp_path / "RUNS.md"
    body = _crlf(new_file_text() + format_rows("one", [[make_result()]])[0] + "\n")
    before = body[:-2] if tail == "<no final newline>" else body + tail.encode()
    path.write_bytes(before)
    append_rows(path, format_rows("two", [[make_result("baseline"), make_result("optimized")]]))
    after = path.read_bytes()
    kept = len(body) - 2  # up to the end of the last non-blank line, its line break included below
    assert after[:kept] == before[:kept]  # byte for byte
    assert after.startswith(body)  # the last old line keeps its CRLF
    assert b"\n" not in after.replace(b"\r\n", b"") and after.endswith(b"|\r\n")
    assert after.count(b"\r\n") == body.count(b"\r\n") + 2  # two rows, nothing else


def test_an_lf_runs_md_with_a_preamble_keeps_every_earlier_byte(tmp_path: Path) -> None:
    path = tmp_path / "RUNS.md"
    before = b"# Our runs\n\nNotes  with trailing spaces  \n"
    path.write_bytes(before)
    append_rows(path, format_rows("m", [[make_result()]]))
    after = path.read_bytes()
    assert after.startswith(before) and b"\r" not in after


def test_a_crlf_runs_md_without_a_table_gets_a_crlf_table(tmp_path: Path) -> None:
    path = tmp_path / "RUNS.md"
    before = b"# Our runs\r\n\r\nNotes.\r\n"
    path.write_bytes(before)
    append_rows(path, format_rows("m", [[make_result()]]))
    after = path.read_bytes()
    assert after.startswith(before) and b"\n" not in after.replace(b"\r\n", b"")


def test_record_through_a_symlinked_runs_md_writes_the_real_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    save_results(tmp_path / "r.json", [make_result()])
    (tmp_path / "docs").mkdir()
    real = tmp_path / "docs" / "RUNS.md"
    real.write_bytes(_crlf(new_file_text()))
    real.chmod(0o664)
    before = real.read_bytes()
    link = tmp_path / "RUNS.md"
    link.symlink_to(real)
    assert main(["record", "--milestone", "m", "r.json"]) == 0, capsys.readouterr().err
    assert link.is_symlink() and os.readlink(link) == str(real)
    after = real.read_bytes()
    assert after.startswith(before) and after.count(b"| m |") == 1 and after.endswith(b"|\r\n")
    assert _mode(real) == 0o664
    assert (tmp_path / "docs" / "RUNS.md.lock").exists() and not (tmp_path / "RUNS.md.lock").exists()
    _no_temporaries(tmp_path, tmp_path / "docs")


def test_a_read_only_runs_md_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "RUNS.md"
    path.write_text(new_file_text(), encoding="utf-8")
    path.chmod(0o444)
    before = path.read_bytes()
    with pytest.raises(UserError, match="is read-only"):
        append_rows(path, format_rows("m", [[make_result()]]))
    assert path.read_bytes() == before and _entries(tmp_path) == ["RUNS.md"]  # no lock file either


# --------------------------------------------------------------------------- run --out through a symlink

def test_run_out_through_a_symlink_writes_the_real_file(tmp_path: Path, tiny: list[str], umask: None,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    real = tmp_path / "results" / "r.json"
    real.parent.mkdir()
    link = tmp_path / "r.json"
    link.symlink_to(real)
    argv = ["run", "ppo-cartpole", "--variant", "baseline", "--quiet", "--out", str(link)]
    assert main([*argv, *[arg for item in tiny for arg in ("--set", item)]]) == 0, capsys.readouterr().err
    assert link.is_symlink() and [r.variant for r in load_results(real)] == ["baseline"]
    assert _mode(real) == 0o644
    _no_temporaries(tmp_path, real.parent)
