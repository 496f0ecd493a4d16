"""The one user-error type (the CLI turns it into a one-line message and exit code 2) and the exit codes."""

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
"""Every rlgauge command's exit codes: done, a check failed, bad input or no verdict, interrupted."""


class UserError(Exception):
    """Bad input from the user (preset, file, option); ``str(err)`` is one line."""


class NoVerdict(UserError):
    """A gate that cannot decide on this machine (a run not trustworthy, too few repeats): exit code 2 like bad
    input, but typed apart (``harness.analyses.gate_outcome``) so callers can skip rather than fail."""
