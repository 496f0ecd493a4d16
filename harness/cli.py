"""The ``rlgauge`` command: a parser, a dispatch table, and one short ``cmd_*`` per subcommand.

Exit codes: 0 success, 1 a check failed (an unstable or failed run), 2 bad input (one line
on stderr, no traceback), 130 interrupted (partial result written, marked).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import NoReturn

import yaml
from rich.console import Console

from reference_trainers.common.config import ConfigError, to_plain_dict
from reference_trainers.common.resolve import resolve_config

from .errors import UserError
from .presets import VARIANTS, list_presets, specs_for
from .report import results_table
from .results import check_writable, save_results

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see '{self.prog} --help')")


def _run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set optimizations.amp=true (repeatable)")
    parser.add_argument("--device", help="auto | cpu | cuda[:N] | mps (default: the preset's, usually auto)")
    parser.add_argument("--steps", type=int, help="timed env-step budget of each repeat")
    parser.add_argument("--repeats", type=int, help="timed repeats per variant (median/min/max)")
    parser.add_argument("--seed", type=int, help="random seed")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rlgauge", description="Benchmark harness for the speed of RL training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="measure a preset's variants (baseline vs optimized) or a config file")
    run.add_argument("target", metavar="PRESET|FILE.yaml")
    run.add_argument("--variant", choices=[*VARIANTS, "both"], default="both")
    _run_options(run)
    run.add_argument("--out", type=Path, metavar="RESULT.json", help="write the results here (atomically)")
    run.add_argument("--quiet", action="store_true", help="no progress bar or optimisation summary")

    sub.add_parser("presets", help="list the shipped presets")

    config = sub.add_parser("config", help="print the resolved config (every flag with its resolved value)")
    config.add_argument("target", metavar="PRESET|FILE.yaml")
    config.add_argument("--variant", choices=[*VARIANTS, "both"], default="both")
    _run_options(config)
    return parser


def _overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` values plus the run options, which are shorthands for config keys."""
    extra = list(args.overrides)
    for option, key in (("device", "device"), ("steps", "run.steps"), ("repeats", "run.repeats"), ("seed", "seed")):
        value = getattr(args, option)
        if value is not None:
            extra.append(f"{key}={value}")
    return extra


def cmd_run(args: argparse.Namespace) -> int:
    from .runner import resolve_specs, run_variants

    specs = specs_for(args.target, args.variant, _overrides(args))
    resolve_specs(specs)  # every flag checked before anything runs
    if args.out is not None:
        check_writable(args.out)
    say = (lambda _text: None) if args.quiet else (lambda text: print(text, file=sys.stderr))
    show_progress = not args.quiet and sys.stderr.isatty()
    results, interrupted = run_variants(specs, show_progress=show_progress, say=say)
    Console(soft_wrap=False, width=max(120, Console().width)).print(results_table(results))
    if args.out is not None:
        try:
            save_results(args.out, results)
        except OSError as exc:
            raise UserError(f"--out {args.out}: cannot write the result ({exc.strerror or exc})") from None
        print(f"results written to {args.out}", file=sys.stderr)
    if interrupted:
        return EXIT_INTERRUPTED
    bad = [r for r in results if r.status != "ok"]
    for result in bad:
        detail = result.error or f"float64_ops={result.stability['float64_ops']} nonfinite_events={result.stability['nonfinite_events']}"
        print(f"rlgauge: {result.variant} run is {result.status}: {detail}", file=sys.stderr)
    return EXIT_CHECK_FAILED if bad else EXIT_OK


def cmd_presets(args: argparse.Namespace) -> int:
    for preset in list_presets():
        print(f"{preset.name:<16} {preset.description}  [variants: {', '.join(preset.variants)}]")
    return EXIT_OK


def cmd_config(args: argparse.Namespace) -> int:
    documents = []
    for spec in specs_for(args.target, args.variant, _overrides(args)):
        resolution = resolve_config(spec.config)
        header = f"# {spec.preset} / {spec.variant}\n"
        reasons = "".join(f"# {key}: auto -> {why}\n" for key, why in resolution.reasons.items())
        documents.append(header + reasons + yaml.safe_dump(to_plain_dict(resolution.config), sort_keys=False))
    print("---\n".join(documents), end="")
    return EXIT_OK


COMMANDS = {"run": cmd_run, "presets": cmd_presets, "config": cmd_config}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rlgauge`` and ``python -m harness``; returns the exit code."""
    logging.basicConfig(level=logging.WARNING, format="rlgauge: %(message)s")
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except (UserError, ConfigError) as exc:
        print(f"rlgauge: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("rlgauge: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)
