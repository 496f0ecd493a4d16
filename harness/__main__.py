"""``python -m harness`` = the ``rlgauge`` command."""

import sys

try:
    from harness.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command is still loading
    print("rlgauge: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())
