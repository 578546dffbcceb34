"""The ``flowerbed`` command line: run, eval, list, show, sweep (and the subcommands other areas add).


One error boundary (``errors.ErrorBoundary``) covers every command: a user-caused error
(``ConfigError``: config, YAML, data, connection, TLS) is one line and exit status 2, a run that
could not go on (``RunFailed``) one line and exit 1, anything else a short traceback and exit 1.
Module-level imports stay light (typer, rich): heavy libraries load when a command needs them,
after the progress display is up. The commands are in ``commands.py`` (``deploy``: ``deploy.py``).
"""

from __future__ import annotations

import logging
import os
import sys

from flowerbed.apps.cli import deploy as _deploy  # noqa: F401 - registers `flowerbed deploy`
from flowerbed.apps.cli.commands import app
from flowerbed.apps.cli.errors import error_line
from flowerbed.apps.cli.process import _record_start, _terminate_on_sigterm

__all__ = ["app", "main"]


def main() -> None:
    """The ``flowerbed`` console script.

    It ends with ``os._exit``: by then every file is closed and every process it started is
    stopped, and skipping the interpreter's teardown of torch and thousands of modules saves
    about 1.5 s of CPU per command.
    """
    _record_start()
    _terminate_on_sigterm()
    try:
        app()
        code: int | str | None = 0
    except SystemExit as exc:
        code = exc.code
    if isinstance(code, str):
        error_line(code)
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
