"""What the commands share: exit codes, the top-level options (``--version``, ``--debug``), the run
options and their config overrides."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator, Sequence

from harness.errors import UserError

from harness.errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_OK  # noqa: F401 (re-exported)
EXIT_INTERNAL_ERROR = 1  # an unexpected failure (a bug, not bad input): the same code as a failed check

DISTRIBUTION = "rlgauge"  # [project] name in pyproject.toml
DEBUG_ENV = "RLGAUGE_DEBUG"
_DEBUG_ON, _DEBUG_OFF = ("1", "true"), ("0", "false", "")


def version_line() -> str:
    """``rlgauge X.Y.Z, torch A.B.C (CUDA 12.8 build | ROCm ... build | CPU-only build)``; the one place
    the light commands' parser imports torch."""
    try:
        ours = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        ours = "(not installed as a distribution)"
    try:
        import torch
    except ImportError:
        return f"{DISTRIBUTION} {ours}, torch not installed"
    cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
    build = f"CUDA {cuda} build" if cuda else f"ROCm {hip} build" if hip else "CPU-only build"
    return f"{DISTRIBUTION} {ours}, torch {torch.__version__} ({build})"


class VersionAction(argparse.Action):
    """``--version``: like argparse's, but the line (and torch) is only computed when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None,  # noqa: A002 - argparse's name
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(version_line(), file=sys.stdout)
        parser.exit(EXIT_OK)


def debug_from_env(value: str | None) -> bool:
    """``RLGAUGE_DEBUG``: 1/true on, 0/false/empty/unset off (any case); anything else is bad input."""
    if value is None or value.strip().lower() in _DEBUG_OFF:
        return False
    if value.strip().lower() in _DEBUG_ON:
        return True
    raise UserError(f"{DEBUG_ENV}={value!r}: accepted: 1 or true (tracebacks on), 0, false or empty (off)")


def add_debug_option(parser: argparse.ArgumentParser, top_level: bool) -> None:
    """``--debug``, before the subcommand (``top_level``) or after it (leaves the top-level value alone)."""
    parser.add_argument("--debug", action="store_true", default=False if top_level else argparse.SUPPRESS,
                        help=f"print the traceback of an unexpected failure (also {DEBUG_ENV}=1)")


DEVICE_HELP = "auto | cpu | cuda[:N] | mps (default: the preset's, usually auto: the accelerator, not the fastest device)"


def run_options(parser: argparse.ArgumentParser, steps_default: str = "the preset's",
                repeats_default: str = "the preset's", device_help: str = DEVICE_HELP) -> None:
    """``--set``, ``--device``, ``--steps``, ``--repeats``, ``--seed``: every measuring command takes them."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set optimizations.amp=true (repeatable)")
    parser.add_argument("--device", help=device_help)
    parser.add_argument("--steps", type=int, help=f"timed env-step budget of each repeat (default: {steps_default})")
    parser.add_argument("--repeats", type=int, help=f"timed repeats per variant, median/min/max (default: {repeats_default})")
    parser.add_argument("--seed", type=int, help="random seed")


def user_overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` values plus the run options, which are shorthands for config keys."""
    extra = list(args.overrides)
    if args.device is not None and "," in args.device:
        raise UserError(f"--device {args.device}: a device list compares devices in 'rlgauge run' only; accepted "
                        "here: one device (auto, cpu, cuda, cuda:N or mps)")
    for option, key in (("device", "device"), ("steps", "run.steps"), ("repeats", "run.repeats"), ("seed", "seed")):
        value = getattr(args, option)
        if value is not None:
            extra.append(f"{key}={value}")
    return extra


QUIET_HELP = ("the trainer's own stdout and stderr go to files (STEM.stdout.txt, STEM.stderr.txt in the current "
              "folder, named on stderr at the end), so the console (and --json's stdout) holds rlgauge's lines alone")


def quiet_option(parser: argparse.ArgumentParser, stem: str) -> None:
    """``--quiet`` for a command that runs a user's trainer in this process (``diagnose``, ``try``)."""
    parser.add_argument("--quiet", action="store_true", help=QUIET_HELP.replace("STEM", stem))


class TrainerOutput:
    """Where a trainer's own output went (``trainer_output``): the files kept, with their line counts."""

    def __init__(self, stem: str) -> None:
        self.paths = {"stdout": Path(f"{stem}.stdout.txt"), "stderr": Path(f"{stem}.stderr.txt")}
        self.kept: dict[str, int] = {}

    def note(self) -> str | None:
        """``the trainer's output: X (N lines), Y (M lines)``, or None when it printed nothing."""
        if not self.kept:
            return None
        return "the trainer's output: " + ", ".join(f"{self.paths[name]} ({lines} lines)"
                                                    for name, lines in self.kept.items())


@contextlib.contextmanager
def trainer_output(quiet: bool, stem: str) -> Iterator[TrainerOutput]:
    """While a user's trainer runs in this process: under ``quiet`` its stdout and stderr (file descriptors 1
    and 2, so a library's log handler and C code are caught too) go to ``STEM.stdout.txt``/``STEM.stderr.txt``,
    each kept only when something was written; otherwise its stdout goes to stderr, so rlgauge's stdout
    (``--json``) is rlgauge's alone. Only one thread should print meanwhile."""
    captured = TrainerOutput(stem)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    files: dict[str, Any] = {}
    try:
        if quiet:
            files = {name: open(path, "w", encoding="utf-8") for name, path in captured.paths.items()}
            os.dup2(files["stdout"].fileno(), 1)
            os.dup2(files["stderr"].fileno(), 2)
        else:
            os.dup2(2, 1)
        if quiet:
            with contextlib.redirect_stdout(files["stdout"]), contextlib.redirect_stderr(files["stderr"]):
                yield captured
        else:
            with contextlib.redirect_stdout(sys.stderr):
                yield captured
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        for name, handle in files.items():
            handle.close()
            path = captured.paths[name]
            with open(path, encoding="utf-8", errors="replace") as written:
                lines = sum(1 for _ in written)
            if lines or path.stat().st_size:
                captured.kept[name] = max(1, lines)
            else:
                path.unlink(missing_ok=True)


def note_trainer_output(output: TrainerOutput | None) -> None:
    """Under ``--quiet``: where the trainer's own output went (stderr, one line; nothing when it wrote none)."""
    note = output.note() if output is not None else None
    if note:
        print(f"rlgauge: {note}", file=sys.stderr)
