"""The command's process: when it started (``wall_s``, ``startup_s``), SIGTERM unwinding like Ctrl-C."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import FrameType


def _record_start() -> None:
    """Let the run's processes measure ``wall_s`` and ``startup_s`` from this command's start."""
    from flowerbed.server.results import STARTED_AT_ENV

    os.environ.setdefault(STARTED_AT_ENV, repr(process_start()))


def process_start() -> float:
    """When this process started (epoch seconds, to the clock tick on Linux).

    ``psutil``'s ``create_time`` adds the start tick to the boot time, which Linux gives in whole
    seconds; the process's age from ``/proc`` (uptime minus start tick) has no such error.
    """
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5); fields[0] is field 3
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        import psutil

        return psutil.Process().create_time()


def _terminate_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so engines stop the processes they started."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
