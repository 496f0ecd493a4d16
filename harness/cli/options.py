"""What the commands share: exit codes, the top-level options (``--version``, ``--debug``), the run
options and their config overrides."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from typing import Any, Sequence

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
