"""User-facing errors: the CLI prints each on one line (``ConfigError``: exit 2, ``RunFailed``: 1)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user-facing configuration or input problem (one line: what is wrong, what is allowed)."""


class RunFailed(RuntimeError):
    """A run that could not go on (every training reply of a round failed); one line, exit 1."""
