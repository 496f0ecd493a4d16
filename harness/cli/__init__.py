"""The ``rlgauge`` command: ``main(argv) -> int`` (``app``), the shared options (``options``) and the analysis
commands (``analysis_commands``)."""

from harness.cli.app import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]
