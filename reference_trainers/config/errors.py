"""The one error type of a configuration the user wrote."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration the user wrote is invalid; ``str(err)`` is one line naming the key, the value and
    what is accepted."""
