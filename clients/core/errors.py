"""User-facing errors: the CLI prints them on one line and exits with status 2."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user-facing configuration or input problem (one line: what is wrong, what is allowed)."""
