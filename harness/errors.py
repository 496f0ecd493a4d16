"""The one user-error type: the CLI turns it into a one-line message and exit code 2."""


class UserError(Exception):
    """Bad input from the user (preset, file, option); ``str(err)`` is one line."""
