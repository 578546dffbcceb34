"""Flower's log and third-party warnings kept off the progress display: into ``RUN_DIR/flower.log``,
on the console only with ``-v`` (:func:`_quiet_flower`, :class:`LogTail`)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import TextIO

from flowerbed.apps.cli.errors import console


class _RunLog(logging.FileHandler):
    """Flower's log of an in-process run, appended to ``RUN_DIR/flower.log`` (where the other
    engines write theirs); the file is opened when the first line comes, once the run directory
    exists (a line before that is dropped, never printed)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, delay=True)
        self.setLevel(logging.INFO)
        self.setFormatter(logging.Formatter("%(levelname)s %(asctime)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is None and not Path(self.baseFilename).parent.is_dir():
            return
        super().emit(record)


def _log_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """``warnings.showwarning`` that hands the warning to the ``py.warnings`` logger."""
    text = warnings.formatwarning(message, category, filename, lineno, line)
    logging.getLogger("py.warnings").warning("%s", text.rstrip())


#: Python's own warning printer (``-v`` keeps it)
_PRINT_WARNING = warnings.showwarning


def _quiet_flower(verbose: bool, log_path: Path | None = None) -> logging.Handler | None:
    """Flower's log at INFO: on the console only with ``-v`` (its own handler, no propagation),
    always in ``log_path`` when given, so its warnings (``fraction_evaluate is set to 0.0``)
    never land in the middle of the progress display; Python warnings of third-party code
    (Opacus' secure RNG, torch's backward hooks) go the same way unless ``-v``. Returns the file
    handler to remove."""
    import flwr.clientapp  # noqa: F401 - configure Flower's logger before adjusting it
    import flwr.serverapp  # noqa: F401

    logger = logging.getLogger("flwr")
    logger.setLevel(logging.INFO if verbose or log_path is not None else logging.WARNING)
    logger.propagate = False
    for handler in logger.handlers:
        if not isinstance(handler, _RunLog):
            handler.setLevel(logging.INFO if verbose else logging.CRITICAL + 1)
    warned = logging.getLogger("py.warnings")  # third-party warnings (Opacus, torch): the log
    # set on every call, not through logging.captureWarnings: that one does nothing once it has
    # run in this process, so a warnings.catch_warnings() around an earlier call (which restores
    # the printer on exit) would leave later runs printing warnings to the terminal
    warnings.showwarning = _PRINT_WARNING if verbose else _log_warning
    warned.propagate = False
    if not any(isinstance(h, logging.NullHandler) for h in warned.handlers):
        warned.addHandler(logging.NullHandler())  # never logging's last-resort stderr printer
    if log_path is None:
        return None
    handler = _RunLog(log_path)
    logger.addHandler(handler)
    warned.addHandler(handler)
    return handler


class LogTail:
    """Prints the lines appended to Flower's log (``-v``), each once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def flush(self) -> None:
        if not self.path.is_file():
            return
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            console.print(line, markup=False, highlight=False, soft_wrap=True)
