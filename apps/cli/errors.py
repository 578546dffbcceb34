"""The CLI's error boundary and consoles: a user-caused error (``ConfigError``: config, YAML, data,
connection, TLS) is one line and exit status 2, a run that could not go on (``RunFailed``) one
line and exit 1, anything else a short traceback and exit 1."""

from __future__ import annotations

import os
import sys
import traceback

import click
import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from flowerbed.clients.core.errors import ConfigError, RunFailed

console = Console(stderr=True)
out = Console()

#: frames of an internal error's traceback that are printed (the innermost ones)
TRACEBACK_FRAMES = 8


def error_line(message: str) -> None:
    """Print ``error: message`` on stderr, on one line."""
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def fail(message: str) -> None:
    """One-line error, exit status 2."""
    error_line(message)
    raise typer.Exit(2)


class ErrorBoundary(TyperGroup):
    """Every command runs inside this: user errors are one line, internal errors a short traceback."""

    def invoke(self, ctx: click.Context) -> object:  # the command's own return value
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            error_line(str(exc))
            raise typer.Exit(2) from None
        except RunFailed as exc:
            error_line(str(exc))
            raise typer.Exit(1) from None
        except (click.exceptions.Exit, click.ClickException, click.Abort, KeyboardInterrupt):
            raise
        except BrokenPipeError:  # `flowerbed list | head`: the reader left, nothing is wrong
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(141) from None
        except Exception as exc:  # noqa: BLE001 - a bug: show where, without locals, exit 1
            traceback.print_exception(exc, limit=-TRACEBACK_FRAMES, file=sys.stderr)
            error_line(f"internal error ({type(exc).__name__}); the traceback above shows where")
            raise typer.Exit(1) from None
