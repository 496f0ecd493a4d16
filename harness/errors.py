"""The one user-error type: the CLI turns it into a one-line message and exit code 2."""


class UserError(Exception):
    """Bad input from the user (preset, file, option); ``str(err)`` is one line."""


class NoVerdict(UserError):
    """A gate that cannot decide on this machine (a run not trustworthy, too few repeats): exit code 2 like bad
    input, but typed apart (``harness.analyses.gate_outcome``) so callers can skip rather than fail."""
