"""What every measuring command shares: the run options, their config overrides, exit codes."""

from __future__ import annotations

import argparse

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def run_options(parser: argparse.ArgumentParser, steps_default: str = "the preset's",
                repeats_default: str = "the preset's") -> None:
    """``--set``, ``--device``, ``--steps``, ``--repeats``, ``--seed``: every measuring command takes them."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set optimizations.amp=true (repeatable)")
    parser.add_argument("--device", help="auto | cpu | cuda[:N] | mps (default: the preset's, usually auto)")
    parser.add_argument("--steps", type=int, help=f"timed env-step budget of each repeat (default: {steps_default})")
    parser.add_argument("--repeats", type=int, help=f"timed repeats per variant, median/min/max (default: {repeats_default})")
    parser.add_argument("--seed", type=int, help="random seed")


def user_overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` values plus the run options, which are shorthands for config keys."""
    extra = list(args.overrides)
    for option, key in (("device", "device"), ("steps", "run.steps"), ("repeats", "run.repeats"), ("seed", "seed")):
        value = getattr(args, option)
        if value is not None:
            extra.append(f"{key}={value}")
    return extra
