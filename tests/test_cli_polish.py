"""What a newcomer expects of the command line: ``--version``, ``--debug``, a description and
positional help on every subcommand, an aligned ``presets`` listing, a progress bar that ends at
its total. (Bad values of the new options: tests/test_bad_input.py.)"""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib import metadata
from typing import Any

import pytest
from rich.progress import MofNCompleteColumn

import harness.cli as cli
from harness.cli import build_parser, main
from harness.specs.presets import list_presets, listing_lines
from harness.measurement.progress import RunProgress

HINT = " (run with --debug for the traceback)"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- --version

def test_version_names_the_distribution_and_the_torch_build(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    code, out, err = _run(capsys, "--version")
    hip = getattr(torch.version, "hip", None)
    build = (f"CUDA {torch.version.cuda} build" if torch.version.cuda else f"ROCm {hip} build" if hip
             else "CPU-only build")
    assert code == 0 and err == ""
    assert out == f"rlgauge {metadata.version('rlgauge')}, torch {torch.__version__} ({build})\n"


def test_version_wins_over_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--version", "run")  # run without its PRESET would be bad input
    assert code == 0 and out.startswith("rlgauge ")


def test_torch_is_imported_for_version_only() -> None:
    """Light commands stay light: ``presets`` loads no torch; ``--version`` does, to name its build."""
    code = ("import sys, contextlib, io, harness.cli as cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert cli.main(['presets']) == 0\n"
            "    assert 'torch' not in sys.modules, 'presets imported torch'\n"
            "    assert cli.main(['--version']) == 0\n"
            "assert 'torch' in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- --debug and RLGAUGE_DEBUG

@pytest.fixture
def failing_presets(monkeypatch: pytest.MonkeyPatch) -> None:
    """``presets`` fails the way a bug would: an exception that is not bad input."""
    def broken(args: Any) -> int:
        raise RuntimeError("lost the\nthread")

    monkeypatch.setitem(cli.COMMANDS, "presets", broken)
    monkeypatch.delenv("RLGAUGE_DEBUG", raising=False)


@pytest.mark.usefixtures("failing_presets")
@pytest.mark.parametrize("env", [None, "0", "", "false"])
def test_an_unexpected_failure_is_one_line_naming_debug(env: str | None, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    if env is not None:
        monkeypatch.setenv("RLGAUGE_DEBUG", env)
    code, out, err = _run(capsys, "presets")
    assert code == 1 and out == ""
    assert err == f"rlgauge: error: RuntimeError: lost the thread{HINT}\n"


@pytest.mark.usefixtures("failing_presets")
@pytest.mark.parametrize("argv, env", [(["--debug", "presets"], None), (["presets", "--debug"], None),
                                       (["presets"], "1"), (["presets"], "true"), (["presets"], "TRUE")])
def test_debug_prints_the_traceback(argv: list[str], env: str | None, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    if env is not None:
        monkeypatch.setenv("RLGAUGE_DEBUG", env)
    code, out, err = _run(capsys, *argv)
    assert code == 1 and out == ""
    assert err.startswith("Traceback (most recent call last):") and "in broken" in err
    assert err.splitlines()[-1] == "rlgauge: error: RuntimeError: lost the thread"


def test_bad_input_stays_one_line_under_debug(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "--debug", "config", "no-such-preset")
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err


# --------------------------------------------------------------------------- help

def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_subcommand_has_a_description_and_positional_help() -> None:
    parser = build_parser()
    commands = _commands(parser)
    assert set(commands) == set(cli.COMMANDS)
    for name, command in {"rlgauge": parser, **commands}.items():
        assert (command.description or "").strip(), f"{name}: no description"
        for action in command._actions:
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert (action.help or "").strip() and action.help != argparse.SUPPRESS, \
                    f"{name} {action.metavar or action.dest}: no help"


def test_run_help_starts_with_its_description(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "run", "--help")
    assert code == 0
    usage, description = out.split("\n\n")[:2]
    assert usage.startswith("usage: rlgauge run") and description.startswith("Measure a preset's")
    assert "a preset name (see 'rlgauge presets') or a YAML config file" in " ".join(out.split())


def test_diagnose_tries_torch_compile_only_when_asked(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``--compile-check`` turns the torch.compile trial on; ``--no-compile-check`` (the default now) is
    still accepted but no longer shown."""
    from harness.measurement import environment

    asked: list[bool] = []

    def report(compile_device: str | None = None, check_compile: bool = True) -> dict[str, Any]:
        asked.append(check_compile)
        raise KeyboardInterrupt  # stop before the diagnosis runs

    monkeypatch.setattr(environment, "environment_report", report)
    for argv in ([], ["--no-compile-check"], ["--compile-check"]):
        assert main(["diagnose", "ppo-cartpole", "--device", "cpu", *argv]) == 130
    assert asked == [False, False, True]
    code, out, _ = _run(capsys, "diagnose", "--help")
    assert code == 0 and "--compile-check" in out and "--no-compile-check" not in out


def test_run_and_config_help_name_lists_all_and_both(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("run", "config"):
        code, out, _ = _run(capsys, command, "--help")
        text = " ".join(out.split())
        assert code == 0 and "--variant NAME[,NAME...]|all|both" in text and "a comma list of them" in text


# --------------------------------------------------------------------------- presets listing

def test_presets_listing_aligns_on_the_longest_name(capsys: pytest.CaptureFixture[str]) -> None:
    presets = list_presets()
    names = [p.name for p in presets]
    assert "ppo-lstm-cartpole-masked" in names  # longer than the 16 columns the listing once assumed
    column = max(map(len, names)) + 2
    code, out, _ = _run(capsys, "presets")
    lines = out.splitlines()
    assert code == 0 and len(lines) == len(presets)
    for preset, line in zip(presets, lines):
        assert line[:column].rstrip() == preset.name and line[column - 1] == " " and line[column] != " "
        assert line[column:].startswith(preset.description)


def test_presets_listing_wraps_under_its_column_on_a_terminal() -> None:
    presets = list_presets()
    column = max(len(p.name) for p in presets) + 2
    lines = listing_lines(presets, width=80)
    assert all(len(line) <= 80 for line in lines)
    starts = [line for line in lines if not line.startswith(" ")]
    assert [line.split()[0] for line in starts] == [p.name for p in presets]
    for line in lines:
        assert line[column - 1] == " " and line[column] != " "  # every text line starts in the column
    joined = " ".join(" ".join(lines).split())
    assert all(" ".join(p.description.split()) in joined for p in presets)


# --------------------------------------------------------------------------- progress bar

def _shown(progress: RunProgress) -> str:
    (task,) = progress._progress.tasks
    assert task.completed <= task.total
    return str(MofNCompleteColumn().render(task))


def test_progress_never_shows_more_than_its_total() -> None:
    """5,048 planned steps in iterations of 1,024: the last one overshoots, the total grows to match."""
    with RunProgress(5048, enabled=True) as progress:
        shown = []
        for _ in range(5):
            progress.advance(1024, progress.completed + 1024)
            shown.append(_shown(progress))
    assert shown[0] == "1024/5048" and shown[3] == "4096/5048"
    assert shown[-1] == "5120/5120" and (progress.completed, progress.total) == (5120, 5120)


def test_progress_short_of_its_total_keeps_it() -> None:
    progress = RunProgress(5048, enabled=True)
    progress.advance(1000, 1000)
    assert _shown(progress) == "1000/5048"


def test_disabled_progress_counts_nothing() -> None:
    progress = RunProgress(10, enabled=False)
    progress.advance(64, 64)
    assert progress.completed == 0
