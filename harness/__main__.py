"""``python -m harness`` = the ``rlgauge`` command."""

from .cli import main

raise SystemExit(main())
