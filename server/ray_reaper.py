"""A watchdog for the processes a Ray sweep driver starts: when the driver dies (even by SIGKILL) or
is done, it kills, by PID, whatever of them is still alive and removes the given paths.

    reaper = Reaper.start([temp_dir])   # just before starting the processes
    ...                                 # descendants of this process created from now on are tracked
    reaper.finish()                     # normal end: leftovers killed, paths removed, reaper gone

Why: a local Ray instance shares its driver's fate only in part. Its GCS and raylet die with the
driver (parent-death signal) and the workers follow the raylet, but Ray's agents outlive a
SIGKILLed driver indefinitely (measured with Ray 2.55.1), and the session directory stays.

The reaper snapshots the driver's descendants created after it was started, every 0.2 s, and learns
of the driver's end from its stdin pipe closing (the driver holds the only write end, so death by
any signal closes it). It runs in its own session: a terminal's Ctrl-C does not kill it with the
driver.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

SNAPSHOT_S = 0.2


class Reaper:
    """The driver's handle on its reaper process."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    @classmethod
    def start(cls, cleanup: list[Path] | None = None) -> Reaper:
        """Start watching this process's descendants created from now on."""
        since = time.time() - 0.05  # create_time granularity is a clock tick
        command = [
            sys.executable,
            "-m",
            "flowerbed.server.ray_reaper",
            str(os.getpid()),
            repr(since),
        ]
        proc = subprocess.Popen(
            [*command, *(str(p) for p in cleanup or [])],
            stdin=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        return cls(proc)

    def finish(self, timeout: float = 30.0) -> None:
        """Tell the reaper the driver is done; it kills what is left and exits."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _descendants(driver: psutil.Process, since: float) -> list[psutil.Process]:
    found = []
    for proc in driver.children(recursive=True):
        try:
            if proc.pid != os.getpid() and proc.create_time() >= since:
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


def _kill(procs: list[psutil.Process]) -> None:
    """SIGKILL the tracked processes still alive (psutil checks each PID was not reused)."""
    victims = []
    for proc in procs:
        try:
            if proc.is_running():
                victims += [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    for proc in victims:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(victims, timeout=10)


def watch(driver_pid: int, since: float, cleanup: list[Path]) -> None:
    """Track ``driver_pid``'s new descendants until stdin closes; then kill and clean up."""
    tracked: dict[int, psutil.Process] = {}
    try:
        driver = psutil.Process(driver_pid)
    except psutil.NoSuchProcess:
        driver = None
    while driver is not None:
        try:
            for proc in _descendants(driver, since):
                tracked[proc.pid] = proc
        except psutil.NoSuchProcess:
            break
        ready, _, _ = select.select([sys.stdin], [], [], SNAPSHOT_S)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break
    _kill(list(tracked.values()))
    for path in cleanup:
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    """``python -m flowerbed.server.ray_reaper DRIVER_PID SINCE [PATH ...]``."""
    watch(int(sys.argv[1]), float(sys.argv[2]), [Path(p) for p in sys.argv[3:]])


if __name__ == "__main__":
    main()
