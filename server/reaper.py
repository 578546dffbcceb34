"""``python -m flowerbed.server.reaper HOME``: the watchdog behind :class:`processes.Reaper`.

Reads ``group PID`` / ``done`` lines from stdin; at end of input without ``done`` (the process
that started it is gone), ends those process groups and every process tagged with HOME, then
removes HOME.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    home = Path(sys.argv[1])
    groups: list[int] = []
    for line in sys.stdin:
        word, _, value = line.strip().partition(" ")
        if word == "done":
            return
        if word == "group" and value.isdigit():
            groups.append(int(value))
    from flowerbed.server.processes import reap

    reap(home, groups)


if __name__ == "__main__":
    main()
